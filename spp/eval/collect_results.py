"""Merge several ``results.json`` files (one per evaluated model) into one Table-2-shaped Markdown table.

Use: ``python -m spp.eval.collect_results --out experiments/results/table.md run_a/results.json run_b/results.json``"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from spp.atomic import write_text_atomic
from spp.eval.tables import EvalRecord, markdown_report


def load_records(paths: Iterable[str | os.PathLike[str]]) -> list[EvalRecord]:
    """Read the records of each ``results.json`` in order (``ValueError`` for a file that is not ``eval.py``'s)."""
    records: list[EvalRecord] = []
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"results file {path} does not exist")
        payload = json.loads(path.read_text())
        if "records" not in payload:
            raise ValueError(f"{path} is not an eval.py results.json (no 'records' key)")
        records += [EvalRecord(**{f.name: r[f.name] for f in fields(EvalRecord)}) for r in payload["records"]]
    return records


def main(argv: list[str] | None = None) -> Path:
    """Command line: merge results files into one Markdown report (written atomically)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results.json files, one row each, in table order")
    parser.add_argument("--out", required=True, help="Markdown file to write")
    parser.add_argument("--title", default="Evaluation", help="report title")
    parser.add_argument("--preamble", default="", help="text placed under the title (protocol, command)")
    args = parser.parse_args(argv)
    report = markdown_report(load_records(args.results), args.title)
    if args.preamble:
        head, _, rest = report.partition("\n\n")
        report = f"{head}\n\n{args.preamble}\n\n{rest}"
    path = write_text_atomic(args.out, report)
    print(report)
    return path


if __name__ == "__main__":
    main()
