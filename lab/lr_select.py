"""Pick a method's learning rate from a grid of runs on the VALIDATION loss only (the one-epoch methods study).

Use: ``python -m lab.lr_select experiments/results/runs/methods_one_epoch/lr_select/spp`` prints one line per
run (learning rate, last Alpaca validation loss, the validation losses measured during the epoch) and marks the
lowest; ``--print-lr`` prints only the chosen learning rate (for scripts); ``--out F`` writes the table as
Markdown. Every ``summary.json`` below the directory is one grid point (a job that failed, ``lr<value>.failed.log``
left by ``experiments/methods_one_epoch/run.sh``, is listed as failed and never chosen; a running one is not listed);
the value compared is the one train.py returns to a sweeper (``sweep_objective=val_loss``: the last validation loss),
never a test-split number. ``--objective ppl_val_merged`` selects on the merged model's WikiText-2 *validation*
perplexity instead (the recovery study; the runs must have measured it: ``eval.extra_ppl_sources=[wikitext2_val]``), the
Alpaca validation loss still shown beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from spp.atomic import write_text_atomic
from spp.sweeps import VALIDATION_OBJECTIVES, objective_value

OBJECTIVE_TITLES = {"val_loss": "last Alpaca validation loss",
                    "ppl_val_merged": "merged WikiText-2 validation perplexity"}


@dataclass(frozen=True)
class GridPoint:
    """One run of a learning-rate grid: its learning rate and the validation losses it measured."""

    lr: float
    val: tuple[float, ...]
    method: str
    path: Path
    failed: bool = False
    ppl_val: float | None = None
    selected_on: str = "val_loss"

    @property
    def objective(self) -> float:
        """The selection value: the last validation loss, or with ``selected_on="ppl_val_merged"`` the merged
        model's WikiText-2 validation perplexity (``inf`` when not measured or not finite)."""
        value = self.ppl_val if self.selected_on == "ppl_val_merged" else (self.val[-1] if self.val else None)
        return value if value is not None and math.isfinite(value) else math.inf


def load_grid(root: str | Path, objective: str = "val_loss") -> list[GridPoint]:
    """The grid points below ``root``, by learning rate, compared on ``objective`` (``val_loss`` or
    ``ppl_val_merged``).

    Raises:
        FileNotFoundError: no ``summary.json`` below ``root``.
        ValueError: runs of different methods mixed in one directory (one grid per method), or an objective that is
            not a validation one.
    """
    if objective not in VALIDATION_OBJECTIVES:
        raise ValueError(f"--objective {objective}: choose one of {', '.join(VALIDATION_OBJECTIVES)}")
    paths = sorted(Path(root).rglob("summary.json"))
    if not paths:
        raise FileNotFoundError(f"no summary.json under {root}; run its grid first "
                                "(experiments/methods_one_epoch/run.sh A or experiments/recovery/run.sh G SETTING)")
    points = []
    for path in paths:
        data = json.loads(path.read_text())
        cfg = data["config"]
        points.append(GridPoint(lr=float(cfg["trainer"]["lr"]), val=tuple(data["losses"]["val"]),
                                method=cfg["adapter"]["name"], path=path,
                                ppl_val=objective_value(data, "ppl_val_merged"), selected_on=objective))
    points += [replace(p, selected_on=objective) for p in failed_points(Path(root), points[0].method)]
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
    """The grid point with the lowest objective (ties: the smaller learning rate).

    Raises:
        ValueError: no grid point measured a finite value of the objective.
    """
    chosen = min(points, key=lambda p: (p.objective, p.lr))
    if not math.isfinite(chosen.objective):
        what = OBJECTIVE_TITLES[chosen.selected_on]
        raise ValueError(f"no run under {chosen.path.parent.parent} measured a finite {what}")
    return chosen


def grid_table(points: list[GridPoint]) -> str:
    """Markdown: learning rate, last validation loss (and with ``ppl_val_merged`` the merged validation
    perplexity), every validation loss of the epoch, chosen mark."""
    chosen = best(points)
    on_ppl = points[0].selected_on == "ppl_val_merged"
    ppl_head, ppl_rule = (" merged WikiText-2 val PPL |", "---:|") if on_ppl else ("", "")
    lines = [f"Learning-rate grid of `{points[0].method}` (objective: {OBJECTIVE_TITLES[points[0].selected_on]})",
             "", f"| lr |{ppl_head} val loss (last) | val losses during the epoch | chosen |",
             f"|---:|{ppl_rule}---:|---|:---:|"]
    for p in points:
        during = ", ".join(f"{v:.4f}" for v in p.val) if not p.failed else f"job failed (`{p.path.name}`)"
        last = p.val[-1] if p.val and math.isfinite(p.val[-1]) else math.inf
        ppl = (f" {p.ppl_val:.2f} |" if p.ppl_val is not None else " – |") if on_ppl else ""
        lines.append(f"| {p.lr:g} |{ppl} {last:.4f} | {during} | {'✓' if p is chosen else ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="one method's grid directory (every summary.json below it is a grid point)")
    parser.add_argument("--print-lr", action="store_true", help="print only the chosen learning rate")
    parser.add_argument("--out", help="also write the Markdown table here")
    parser.add_argument("--objective", default="val_loss", choices=VALIDATION_OBJECTIVES,
                        help="select on the last Alpaca validation loss (default) or the merged model's WikiText-2 "
                             "validation perplexity")
    args = parser.parse_args(argv)
    try:
        points = load_grid(args.root, args.objective)
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
