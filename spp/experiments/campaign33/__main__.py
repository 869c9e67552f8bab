"""``python -m spp.experiments.campaign33 extend GRID_DIR | competitor ROOT SETTING |
val-ppl ROOT SETTING METHOD | chosen-dir ROOT SETTING METHOD | relativize ROOT | machine RUN_DIR |
report ROOT [--out MD] | figure ROOT --out PNG``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spp.atomic import write_text_atomic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spp.experiments.campaign33", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ext = sub.add_parser("extend", help="print the rate that extends a grid past its chosen endpoint (or nothing)")
    ext.add_argument("grid", help="one (setting, method) grid directory: experiments/results/runs/campaign33/grid/S/M")
    comp = sub.add_parser("competitor", help="print SPP's closest competitor in a setting (lowest validation PPL)")
    comp.add_argument("root")
    comp.add_argument("setting")
    vp = sub.add_parser("val-ppl", help="print a method's merged validation PPL at its chosen rate (seed 0)")
    vp.add_argument("root")
    vp.add_argument("setting")
    vp.add_argument("method")
    rel = sub.add_parser("relativize", help="write the machine's absolute paths in finished jobs' files relative")
    rel.add_argument("root")
    cd = sub.add_parser("chosen-dir", help="print the run directory of a method's chosen grid point (seed 0)")
    cd.add_argument("root")
    cd.add_argument("setting")
    cd.add_argument("method")
    mach = sub.add_parser("machine", help="write a finished job's machine.json (CPU, capability, threads, load)")
    mach.add_argument("run_dir")
    mach.add_argument("--load-start", type=float, default=None, help="1-minute load average when the job started")
    mach.add_argument("--note", help="when it was written, if not right after the job")
    rep = sub.add_parser("report", help="the Markdown report of the campaign")
    rep.add_argument("root", help="the campaign directory (experiments/results/runs/campaign33)")
    rep.add_argument("--out", help="Markdown file to write (atomically)")
    fig = sub.add_parser("figure", help="the figure (PNG) and the JSON of what it plots")
    fig.add_argument("root")
    fig.add_argument("--out", required=True, help="PNG to write; the plotted numbers go to the same name .json")
    args = parser.parse_args(argv)
    try:
        if args.command == "extend":
            from spp.experiments.campaign33.selection import next_point

            print(next_point(args.grid))
        elif args.command == "relativize":
            from spp.experiments.campaign33.provenance import relativize

            for path in relativize(args.root):
                print(path)
        elif args.command == "machine":
            from spp.experiments.campaign33.provenance import write_machine

            print(write_machine(args.run_dir, args.load_start, args.note))
        elif args.command in ("competitor", "val-ppl", "chosen-dir"):
            print(_choice_query(args))
        elif args.command == "report":
            from spp.experiments.campaign33.tables import report

            text = report(Path(args.root))
            if args.out:
                write_text_atomic(Path(args.out), text)
            sys.stdout.write(text)
        else:
            from spp.experiments.campaign33.figure import draw

            print(draw(Path(args.root), Path(args.out)))
    except (FileNotFoundError, ValueError) as err:
        print(f"campaign33: {err}", file=sys.stderr)
        return 2
    return 0


def _choice_query(args: argparse.Namespace) -> str:
    from spp.experiments.campaign33.choices import choices, closest_competitor, val_ppl
    from spp.experiments.campaign33.records import load

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


if __name__ == "__main__":
    sys.exit(main())
