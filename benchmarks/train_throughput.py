"""Tokens/s logged by a real training job vs the benchmark harness timing the same batches (issue 7, item 6).

Run: ``nice -n 10 python -m benchmarks.train_throughput`` (embedded SmolLM2-135M, magnitude 2:4, SPP r=16, dropout
0.05, batch 4 of Alpaca records cut at 256 tokens; about 3 min on 2 CPU cores).

1. ``train.py``'s pipeline (``run_training``) trains for ``--steps`` optimizer steps and logs
   ``train/tokens_per_s`` (non-padding tokens of the batch / wall time since the previous batch ended) to
   ``csv/metrics.csv``; a callback keeps a copy of every training batch.
2. The harness (``benchmarks.model_bench.make_step``: forward, backward, AdamW step, ``zero_grad``) times each of
   those batches ``--repeats`` times, interleaved, on a separately built copy of the same pruned model with the
   same adapter (pruned weights from the job's pruning cache).
3. Per step: ratio = logged tokens/s / harness tokens/s. The first ``--skip`` steps (allocator and autograd
   warm-up) are left out of the median. Writes ``experiments/results/train_throughput_<device>.json``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch

from benchmarks.model_bench import make_step
from spp.bench.common import configure_malloc, environment, interleaved, write_json

TOLERANCE = 0.20


class BatchRecorder(L.Callback):
    """Keeps a CPU copy of every training batch, in order."""

    def __init__(self) -> None:
        self.batches: list[dict[str, torch.Tensor]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        self.batches.append({k: v.detach().cpu().clone() for k, v in batch.items()})


def logged_tokens_per_s(metrics_csv: Path) -> dict[int, float]:
    """``train/tokens_per_s`` per logged row of a Lightning CSV log, keyed by the row's ``step``."""
    out: dict[int, float] = {}
    with open(metrics_csv) as fh:
        for row in csv.DictReader(fh):
            if row.get("train/tokens_per_s"):
                out[int(row["step"])] = float(row["train/tokens_per_s"])
    return out


def compare(logged: list[float], harness: list[float], skip: int) -> dict[str, Any]:
    """Per-step ratios logged / harness and their median over the steps after ``skip``."""
    if len(logged) != len(harness):
        raise ValueError(f"{len(logged)} logged steps but {len(harness)} harness timings")
    ratios = [a / b for a, b in zip(logged, harness, strict=True)]
    kept = ratios[skip:]
    if not kept:
        raise ValueError(f"--skip {skip} leaves no step to compare (only {len(ratios)} steps)")
    median = statistics.median(kept)
    return {"ratios": ratios, "median_ratio": median, "within_tolerance": abs(median - 1) <= TOLERANCE}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_135m", help="conf/model group option")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--dropout", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the median")
    parser.add_argument("--out", default=None, help="JSON file name under experiments/results/ (or a path)")
    parser.add_argument("--work-dir", default=None, help="run / cache directory (default: a temporary one)")
    args = parser.parse_args(argv)
    configure_malloc()
    with tempfile.TemporaryDirectory(prefix="spp-throughput-") as tmp:
        return _run(args, Path(args.work_dir or tmp))


def _run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import spp
    from experiments.plan import compose_job
    from spp.models import load_model
    from spp.pruning import get_or_prune
    from spp.training.pipeline import run_training

    overrides = [
        f"model={args.model}", "pruner=magnitude", "sparsity=nm2_4", "adapter=spp", f"adapter.dropout={args.dropout}",
        f"data.max_length={args.max_length}", f"data.train_batch_size={args.batch}",
        f"data.max_examples={args.batch * args.steps + 8}", "data.val_size=8", f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=1", "trainer.log_every_n_steps=1", "trainer.limit_val_batches=0",
        "trainer.accelerator=cpu" if not torch.cuda.is_available() else "trainer.accelerator=auto",
        "trainer.progress_bar=none", "logger=csv", "eval=none", "dense_ppl=false", "pruned_ppl=false",
        "export.merged=false", "export.adapter=false", "print_config=false",
        f"run_dir={work / 'run'}", f"cache_dir={work / 'cache'}",
    ]
    cfg = compose_job(overrides)  # typed and range-checked before any weight is loaded
    recorder = BatchRecorder()
    summary = run_training(cfg, extra_callbacks=[recorder])
    logged_by_step = logged_tokens_per_s(work / "run" / "csv" / "metrics.csv")
    logged = [logged_by_step[s] for s in sorted(logged_by_step)]

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_model(cfg.model)
    get_or_prune(model, tokenizer, dict(cfg.model), dict(cfg.pruner), dict(cfg.sparsity), dict(cfg.calibration),
                 cache_dir=cfg.cache_dir, data_dir=cfg.data_dir)
    adapter = cfg.adapter
    model = spp.inject(model, targets=tuple(adapter.targets), r=adapter.r, dropout=adapter.dropout).to(device).train()
    batches = [{k: v.to(device) for k, v in b.items()} for b in recorder.batches]
    steps = {f"step{i}": make_step(model, b) for i, b in enumerate(batches)}
    timed = interleaved(steps, args.repeats, 1, device)
    tokens = [int(b["attention_mask"].sum()) for b in batches]
    harness = [n / timed[f"step{i}"]["time_s"] for i, n in enumerate(tokens)]
    result = compare(logged, harness, args.skip)
    payload = {
        "benchmark": "train_throughput", "model": args.model, "batch": args.batch, "max_length": args.max_length,
        "dropout": args.dropout, "steps": args.steps, "repeats": args.repeats, "skip": args.skip,
        "tolerance": TOLERANCE, "tokens_per_batch": tokens,
        "padded_lengths": [int(b["input_ids"].shape[1]) for b in batches],
        "logged_tokens_per_s": logged, "harness_tokens_per_s": harness, **result,
        "train_seconds": summary["timings"]["train"], "env": environment(device),
    }
    print(f"{'step':>4} {'tokens':>6} {'logged tok/s':>13} {'harness tok/s':>14} {'ratio':>6}")
    for i, (n, a, b) in enumerate(zip(tokens, logged, harness, strict=True)):
        mark = " (warm-up)" if i < args.skip else ""
        print(f"{i:>4} {n:>6} {a:>13.1f} {b:>14.1f} {a / b:>6.2f}{mark}")
    verdict = "within" if result["within_tolerance"] else "OUTSIDE"
    print(f"median ratio logged/harness: {result['median_ratio']:.3f} ({verdict} ±{TOLERANCE:.0%})")
    path = write_json(payload, args.out or f"train_throughput_{device.type}.json")
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
