"""``python -m spp.compare <folder of runs or a multirun folder> [--metric ppl] [--x adapter.r] [--out DIR]``.

Prints and writes ``compare.md``/``compare.csv`` and ``compare_<metric>_vs_<x>.png``; bad input is one ``error:`` line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spp.atomic import write_file_atomic, write_text_atomic
from spp.compare.figure import choose_x, plot_metric
from spp.compare.runs import find_runs, swept_keys
from spp.compare.table import COMPARED_METRICS, compare_rows, csv_table, markdown_table
from spp.errors import UserError, cli_errors

PROG = "python -m spp.compare"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` lists the metrics)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Table and figure of a sweep, keyed by the config keys that differ between its runs.",
        epilog="metrics: " + "; ".join(f"{m.name} = {m.label}" for m in COMPARED_METRICS.values()))
    parser.add_argument("folder", type=Path, help="a train.py run folder, a multirun folder, or a tree of them")
    parser.add_argument("--metric", default="ppl", choices=list(COMPARED_METRICS),
                        help="what the figure draws (default ppl)")
    parser.add_argument("--x", default=None, help="the swept key on the figure's x axis (default: the first numeric)")
    parser.add_argument("--out", type=Path, default=None, help="where compare.md/.csv/.png go (default: the folder)")
    parser.add_argument("--no-figure", action="store_true", help="write the table only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the command; the written files are printed after the table."""
    args = parse_args(argv)
    with cli_errors(PROG):
        runs = find_runs(args.folder)
        keys = swept_keys(runs)
        rows = compare_rows(runs, keys)
        x = None if args.no_figure or not keys else choose_x(rows, keys, args.x)
        if args.x is not None and x is None and not args.no_figure:
            raise UserError(f"--x {args.x} was given but these runs differ in no key", "drop --x", key="--x")
        out = args.out or args.folder
        table = markdown_table(rows, keys)
        print(f"{len(runs)} runs under {args.folder}; swept: {', '.join(keys) or '(nothing differs)'}")
        print(table, end="")
        written = [write_text_atomic(out / "compare.md", table),
                   write_text_atomic(out / "compare.csv", csv_table(rows))]
        if x is not None:
            figure = plot_metric(rows, keys, args.metric, x)
            png = out / f"compare_{args.metric}_vs_{x}.png"
            written.append(write_file_atomic(png, lambda tmp: figure.savefig(tmp, format="png", dpi=120)))
        print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
