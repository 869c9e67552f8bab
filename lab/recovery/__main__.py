"""``python -m lab.recovery COMMAND ...``: ``extend GRID_DIR`` (the runner's next grid point),
``grid-rates METHOD [--setting S --root ROOT]`` (its base grid there),
``competitor | val-ppl | chosen-dir`` (the runner's queries), ``relativize ROOT``, ``machine RUN_DIR``,
``report ROOT [--out MD]``, ``figure ROOT --out PNG``, ``coverage ROOT --out JSON``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spp.atomic import write_text_atomic

COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "extend": ("print the rate that extends a grid past its chosen endpoint (nothing when it is interior)",
               ("grid",)),
    "grid-rates": ("print a method's base learning-rate grid in a setting (the runner's grid points)", ("method",)),
    "competitor": ("print SPP's closest competitor in a setting (lowest validation PPL)", ("root", "setting")),
    "val-ppl": ("print a method's merged validation PPL at its chosen rate (seed 0)", ("root", "setting", "method")),
    "chosen-dir": ("print the run directory of a method's chosen grid point (seed 0)", ("root", "setting", "method")),
    "relativize": ("write the machine's absolute paths in finished jobs' files relative", ("root",)),
    "machine": ("write a finished job's machine.json (CPU, capability, threads, load)", ("run_dir",)),
    "report": ("the Markdown report of the campaign", ("root",)),
    "figure": ("the figure (PNG) and the JSON of what it plots (same name, .json)", ("root",)),
    "coverage": ("simulate the paired intervals' coverage with few seeds on the campaign's per-window data",
                 ("root",)),
}
"""Command -> (help, positional arguments). ``root`` is the campaign directory
(``experiments/results/runs/recovery``); ``grid`` one (setting, method) grid directory under its ``grid/``."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.recovery", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    subs = {}
    for name, (text, positionals) in COMMANDS.items():
        subs[name] = sub.add_parser(name, help=text)
        for arg in positionals:
            subs[name].add_argument(arg)
    subs["machine"].add_argument("--load-start", type=float, default=None, help="load average when the job started")
    subs["machine"].add_argument("--note", help="when it was written, if not right after the job")
    subs["grid-rates"].add_argument("--setting", default="nm2_4", help="the setting (default: the anchor, nm2_4)")
    subs["grid-rates"].add_argument("--root", help="the campaign directory, whose settled anchor grid centres the "
                                    "grid of another setting")
    subs["report"].add_argument("--out", help="Markdown file to write (atomically)")
    subs["figure"].add_argument("--out", required=True, help="PNG to write")
    subs["coverage"].add_argument("--out", required=True, help="JSON to write (atomically)")
    subs["coverage"].add_argument("--replicates", type=int, default=None, help="synthetic experiments per "
                                  "comparison and seed count (default: the committed check's)")
    return p


def run(args: argparse.Namespace) -> str:
    """What the command prints."""
    if args.command == "extend":
        from lab.recovery.selection import next_point

        return next_point(args.grid)
    if args.command == "grid-rates":
        from lab.recovery.selection import base_grid, settled_anchor

        anchor = settled_anchor(args.root, args.setting, args.method) if args.root else None
        return " ".join(base_grid(args.method, anchor))
    if args.command == "relativize":
        from lab.recovery.provenance import relativize

        return "\n".join(str(p) for p in relativize(args.root))
    if args.command == "machine":
        from lab.recovery.provenance import write_machine

        return str(write_machine(args.run_dir, args.load_start, args.note))
    if args.command == "report":
        from lab.recovery.tables import report

        text = report(Path(args.root))
        if args.out:
            write_text_atomic(Path(args.out), text)
        return text.rstrip("\n")
    if args.command == "figure":
        from lab.recovery.figure import draw

        return str(draw(Path(args.root), Path(args.out)))
    if args.command == "coverage":
        return _coverage(args)
    return _choice_query(args)


def _coverage(args: argparse.Namespace) -> str:
    import json

    from lab.recovery.coverage import REPLICATES
    from lab.recovery.coverage import run as simulate

    if args.replicates is not None and args.replicates < 1:
        raise ValueError(f"--replicates {args.replicates}: give at least 1 synthetic experiment")
    if not Path(args.root).is_dir():
        raise FileNotFoundError(f"{args.root} is not a directory: give the campaign directory "
                                "(experiments/results/runs/recovery)")
    data = simulate(args.root, args.replicates or REPLICATES)
    write_text_atomic(Path(args.out), json.dumps(data, indent=1) + "\n")
    return json.dumps(data["mean_coverage"])


def _choice_query(args: argparse.Namespace) -> str:
    from lab.recovery.choices import choices, closest_competitor, val_ppl
    from lab.recovery.records import load

    chosen = choices(load(args.root))
    if args.command == "competitor":
        rival = closest_competitor(chosen, args.setting)
        if rival is None:
            raise ValueError(f"no grid of a method other than SPP in setting {args.setting!r} under {args.root}")
        return rival
    ch = chosen.get((args.setting, args.method))
    if ch is None:
        raise ValueError(f"no grid of {args.method!r} in setting {args.setting!r} under {args.root}")
    if args.command == "chosen-dir":
        return str(Path(args.root) / ch.chosen.rel)
    return f"{val_ppl(ch.chosen):.6g}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        out = run(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"recovery: {err}", file=sys.stderr)
        return 2
    if out:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
