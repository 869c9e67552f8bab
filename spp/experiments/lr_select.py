"""Pick a method's learning rate from a grid of runs on the VALIDATION loss only (issue 16).

Use: ``python -m spp.experiments.lr_select experiments/results/runs/campaign16/lr_select/spp`` prints one line per
run (learning rate, last Alpaca validation loss, the validation losses measured during the epoch) and marks the
lowest; ``--print-lr`` prints only the chosen learning rate (for scripts); ``--out F`` writes the table as
Markdown. Every ``summary.json`` below the directory is one grid point (a job that failed, ``lr<value>.failed.log``
left by ``experiments/campaign16/run.sh``, is listed as failed and never chosen; a running one is not listed);
the value compared is the one train.py returns to a sweeper (``sweep_objective=val_loss``: the last validation loss),
never a test-split number.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from spp.atomic import write_text_atomic


@dataclass(frozen=True)
class GridPoint:
    """One run of a learning-rate grid: its learning rate and the validation losses it measured."""

    lr: float
    val: tuple[float, ...]
    method: str
    path: Path
    failed: bool = False

    @property
    def objective(self) -> float:
        """The last validation loss (``inf`` when none was measured or it is not finite)."""
        last = self.val[-1] if self.val else math.inf
        return last if math.isfinite(last) else math.inf


def load_grid(root: str | Path) -> list[GridPoint]:
    """The grid points below ``root``, by learning rate.

    Raises:
        FileNotFoundError: no ``summary.json`` below ``root``.
        ValueError: runs of different methods mixed in one directory (one grid per method).
    """
    paths = sorted(Path(root).rglob("summary.json"))
    if not paths:
        raise FileNotFoundError(f"no summary.json under {root}; run the grid first (experiments/campaign16/run.sh A)")
    points = []
    for path in paths:
        data = json.loads(path.read_text())
        cfg = data["config"]
        points.append(GridPoint(lr=float(cfg["trainer"]["lr"]), val=tuple(data["losses"]["val"]),
                                method=cfg["adapter"]["name"], path=path))
    points += failed_points(Path(root), points[0].method)
    methods = {p.method for p in points}
    if len(methods) > 1:
        raise ValueError(f"{root} mixes methods {sorted(methods)}; give one method's grid directory")
    return sorted(points, key=lambda p: p.lr)


def failed_points(root: Path, method: str) -> list[GridPoint]:
    """Grid points whose job failed: ``run.sh`` leaves ``lr<value>.failed.log`` beside the job directory."""
    out = []
    for log in sorted(root.glob("lr*.failed.log")):
        run_dir = log.with_name(log.name.removesuffix(".failed.log"))
        if not (run_dir / "summary.json").exists():
            out.append(GridPoint(lr=float(run_dir.name[2:]), val=(), method=method, path=log, failed=True))
    return out


def best(points: list[GridPoint]) -> GridPoint:
    """The grid point with the lowest last validation loss (ties: the smaller learning rate).

    Raises:
        ValueError: no grid point measured a finite validation loss.
    """
    chosen = min(points, key=lambda p: (p.objective, p.lr))
    if not math.isfinite(chosen.objective):
        raise ValueError(f"no run under {chosen.path.parent.parent} measured a finite validation loss")
    return chosen


def grid_table(points: list[GridPoint]) -> str:
    """Markdown: learning rate, last validation loss, every validation loss of the epoch, chosen mark."""
    chosen = best(points)
    lines = [f"Learning-rate grid of `{points[0].method}` (objective: last Alpaca validation loss)", "",
             "| lr | val loss (last) | val losses during the epoch | chosen |", "|---:|---:|---|:---:|"]
    for p in points:
        during = ", ".join(f"{v:.4f}" for v in p.val) if not p.failed else f"job failed (`{p.path.name}`)"
        lines.append(f"| {p.lr:g} | {p.objective:.4f} | {during} | {'✓' if p is chosen else ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="one method's grid directory (every summary.json below it is a grid point)")
    parser.add_argument("--print-lr", action="store_true", help="print only the chosen learning rate")
    parser.add_argument("--out", help="also write the Markdown table here")
    args = parser.parse_args(argv)
    try:
        points = load_grid(args.root)
        table = grid_table(points)
        chosen = best(points)
    except (FileNotFoundError, ValueError) as err:
        print(f"lr_select: {err}", file=sys.stderr)
        return 2
    if args.out:
        write_text_atomic(Path(args.out), table)
    print(f"{chosen.lr:g}" if args.print_lr else table, end="" if not args.print_lr else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
