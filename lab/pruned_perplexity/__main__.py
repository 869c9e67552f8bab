"""``python -m lab.pruned_perplexity run [--only LABEL ...]``: run every row whose raw file is missing (one at a time,
the dense model loaded once); ``report [--out MD]``: the report from the raw files (stdout without ``--out``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from lab.pruned_perplexity.report import REPORT, report
from lab.pruned_perplexity.runs import MODEL_PATH, RUNS_DIR, rows, run_row
from spp.atomic import write_text_atomic
from spp.models import load_model
from spp.paths import REPO_ROOT


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.pruned_perplexity", description=__doc__)
    p.add_argument("command", choices=["run", "report"])
    p.add_argument("--only", nargs="*", help="run: only these labels (e.g. ria-unstructured50)")
    p.add_argument("--out", type=Path, help="report: the Markdown file to write")
    args = p.parse_args(argv)
    if args.command == "report":
        text = report(REPO_ROOT / RUNS_DIR)
        if args.out is None:
            sys.stdout.write(text)
        else:
            write_text_atomic(args.out, text)
        return
    todo = [r for r in rows() if not (REPO_ROOT / RUNS_DIR / f"{r.label}.json").is_file()
            and (not args.only or r.label in args.only)]
    if not todo:
        return
    torch.set_num_threads(1)
    model, tokenizer = load_model(MODEL_PATH)
    dense = {k: v.clone() for k, v in model.state_dict().items()}
    for row in todo:
        record = run_row(row, model, tokenizer, dense, RUNS_DIR)
        ppl = record["perplexity"]
        print(json.dumps({"label": row.label, "ppl": ppl["ppl"], "ci": [ppl["ci_low"], ppl["ci_high"]],
                          "sparsity": record["actual_sparsity"], "prune_s": round(record["prune_seconds"], 1)}),
              flush=True)
    write_text_atomic(REPO_ROOT / REPORT, report(REPO_ROOT / RUNS_DIR))


if __name__ == "__main__":
    main()
