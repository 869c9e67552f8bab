"""Tokens/s logged by real ``train.py`` runs vs the benchmark harness timing the same batches.

Run from the repository root, after one or more ``python train.py ... trainer.log_every_n_steps=1`` runs::

    python -m benchmarks.train_throughput --run <spp run_dir> --run <lora run_dir>

For each run directory (``resolved_config.yaml`` + ``csv/metrics.csv``, as ``train.py`` writes them):

1. the logged throughput column (``LOGGED_TOKENS_PER_S``, else the older per-batch ``LEGACY_TOKENS_PER_S``) is
   read per logged step, with the batches each value covers (one batch, or ThroughputMonitor's window);
2. the harness rebuilds that run's step from its ``resolved_config.yaml`` (``lab.bench.step.StepSetting``: model,
   zero pattern, adapter, data, optimizer; no ``spp.training`` import), takes the same first-epoch batches from
   the job's data module, and times each covered batch ``--repeats`` times (forward, backward, AdamW,
   ``zero_grad``), all runs' models interleaved in one process at the runs' thread count (``--threads``);
3. per step: ratio = logged tokens/s / harness tokens/s; the first ``--skip`` steps (allocator and autograd
   warm-up) are left out of the medians. With two runs the ratio of their logged medians is set beside the
   harness ratio of the same two steps (e.g. SPP/LoRA step time from the training log and from the harness).

Writes ``experiments/results/train_throughput_<device>.json``.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lab.bench.common import add_malloc_option, apply_malloc, environment, interleaved, write_json
from lab.bench.step import StepSetting, batch_tokens, load_pruned, make_step, training_batches
from lab.bench.variants import LORA_ALPHA, lora_model
from spp.adapters.methods.spp.model import inject

LOGGED_TOKENS_PER_S = "train/device/items_per_sec"
"""The CSV column ``train.py`` logs its training throughput under: Lightning's ``ThroughputMonitor`` with
``length_fn`` = unpadded tokens of a batch, i.e. tokens/s over a sliding window of batches. The one place that
names it: change it here if the training loop logs it under another name."""

LEGACY_TOKENS_PER_S = "train/tokens_per_s"
"""The column of runs logged before ``ThroughputMonitor`` (per batch: its tokens / the wall time since the
previous batch ended), e.g. the committed paper-table runs; read when ``LOGGED_TOKENS_PER_S`` is absent."""

WINDOWED = {LOGGED_TOKENS_PER_S: True, LEGACY_TOKENS_PER_S: False}

TOLERANCE = 0.20


def logged_tokens_per_s(metrics_csv: Path, columns: tuple[str, ...] = (LOGGED_TOKENS_PER_S, LEGACY_TOKENS_PER_S)
                        ) -> tuple[str, dict[int, float]]:
    """The first of ``columns`` present in a Lightning CSV log, and its value per logged row keyed by ``step``.

    Raises:
        KeyError: the CSV has none of the columns (names the columns it has).
    """
    out: dict[int, float] = {}
    with open(metrics_csv) as fh:
        reader = csv.DictReader(fh)
        present = [c for c in columns if c in (reader.fieldnames or [])]
        if not present:
            raise KeyError(f"{metrics_csv} has none of the columns {list(columns)} (columns: {reader.fieldnames}); "
                           "set LOGGED_TOKENS_PER_S in benchmarks/train_throughput.py to the logged throughput name")
        column = present[0]
        for row in reader:
            if row.get(column):
                out[int(row["step"])] = float(row[column])
    return column, out


def covered_batches(steps: list[int], windowed: bool) -> dict[int, list[int]]:
    """The batches (first epoch, 0-based) whose time each logged step's value measures.

    Per-batch logging: step ``s`` measures batch ``s``. ``ThroughputMonitor`` (window of ``w`` batch ends, first
    value at step ``w - 1``): step ``s`` measures the tokens and time of batches ``s - w + 2 .. s``.
    """
    if not windowed:
        return {s: [s] for s in steps}
    window = steps[0] + 1
    return {s: list(range(s - window + 2, s + 1)) for s in steps}


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


def build_model(setting: StepSetting, base: nn.Module) -> nn.Module:
    """The run's adapter on ``base``: SPP (its impl, r, scale, dropout) or peft LoRA (r, alpha 16, dropout)."""
    if setting.adapter_name == "spp":
        return inject(base, targets=setting.targets, r=setting.r, scale=setting.scale, dropout=setting.dropout,
                      impl=setting.impl).train()
    if setting.adapter_name == "lora":
        return lora_model(base, setting.targets, setting.dropout, r=setting.r).train()
    raise ValueError(f"adapter.name={setting.adapter_name!r}: the harness times spp and lora runs only")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True,
                        help="a train.py run directory (resolved_config.yaml + csv/metrics.csv); repeatable")
    parser.add_argument("--threads", type=int, default=None, help="harness threads (default: torch's current)")
    parser.add_argument("--steps", type=int, default=None, help="compare the first N logged steps (default all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", type=int, default=2, help="first logged steps left out of the medians")
    add_malloc_option(parser)
    parser.add_argument("--out", default=None, help="JSON file name under experiments/results/ (or a path)")
    args = parser.parse_args(argv)
    apply_malloc(args.malloc)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    runs: dict[str, dict[str, Any]] = {}
    steps: dict[str, Any] = {}
    for path in args.run:
        run = Path(path)
        setting = StepSetting.from_resolved_config(run / "resolved_config.yaml")
        column, logged_by_step = logged_tokens_per_s(run / "csv" / "metrics.csv")
        base, tokenizer = load_pruned(setting)
        batches = training_batches(setting, tokenizer)
        idx = [s for s in sorted(logged_by_step) if s < len(batches)][: args.steps]  # first epoch only
        if not idx:
            raise ValueError(f"{run}: no logged {column} row in the first epoch")
        cover = covered_batches(idx, WINDOWED[column])
        name = f"{setting.adapter_name}-r{setting.r}:{run.name}"
        model = build_model(setting, base)
        for i in sorted({b for bs in cover.values() for b in bs}):
            steps[f"{name}#{i}"] = make_step(model, batches[i], lr=setting.lr, weight_decay=setting.weight_decay,
                                             betas=setting.betas)
        runs[name] = {"run_dir": str(run), "setting": setting.describe(), "column": column, "steps": idx,
                      "covered_batches": {str(k): v for k, v in cover.items()},
                      "tokens": [sum(batch_tokens(batches[b]) for b in cover[i]) for i in idx],
                      "positions": [sum(int(batches[b]["input_ids"].numel()) for b in cover[i]) for i in idx],
                      "logged_tokens_per_s": [logged_by_step[i] for i in idx]}
    load0 = os.getloadavg()[0]
    timed = interleaved(steps, args.repeats, 1, device)
    for name, r in runs.items():
        cover = {int(k): v for k, v in r["covered_batches"].items()}
        r["harness_time_s"] = [sum(timed[f"{name}#{b}"]["time_s"] for b in cover[i]) for i in r["steps"]]
        r["harness_cpu_s"] = [sum(timed[f"{name}#{b}"]["cpu_s"] for b in cover[i]) for i in r["steps"]]
        r["harness_tokens_per_s"] = [n / t for n, t in zip(r["tokens"], r["harness_time_s"], strict=True)]
        skip = args.skip if not WINDOWED[r["column"]] else 0  # a window already starts after the first batch
        r["skip"] = skip
        r.update(compare(r["logged_tokens_per_s"], r["harness_tokens_per_s"], skip))
        kept = slice(skip, None)
        r["logged_median_tokens_per_s"] = statistics.median(r["logged_tokens_per_s"][kept])
        r["harness_median_tokens_per_s"] = statistics.median(r["harness_tokens_per_s"][kept])
        print(f"\n{name} ({r['run_dir']})")
        print(f"{'step':>4} {'tokens':>6} {'logged tok/s':>13} {'harness tok/s':>14} {'ratio':>6}")
        for j, (i, n, a, b) in enumerate(zip(r["steps"], r["tokens"], r["logged_tokens_per_s"],
                                             r["harness_tokens_per_s"], strict=True)):
            mark = " (warm-up)" if j < skip else ""
            print(f"{i:>4} {n:>6} {a:>13.1f} {b:>14.1f} {a / b:>6.2f}{mark}")
        verdict = "within" if r["within_tolerance"] else "OUTSIDE"
        print(f"median ratio logged/harness: {r['median_ratio']:.3f} ({verdict} ±{TOLERANCE:.0%})")
    names = list(runs)
    pair: dict[str, Any] = {}
    if len(names) == 2:
        a, b = (runs[n] for n in names)
        if a["steps"] == b["steps"] and a["skip"] == b["skip"]:
            kept_a, kept_b = a["harness_time_s"][a["skip"]:], b["harness_time_s"][b["skip"]:]
            pair = {"runs": names,
                    "logged_time_ratio": b["logged_median_tokens_per_s"] / a["logged_median_tokens_per_s"],
                    "harness_time_ratio": statistics.median(x / y for x, y in zip(kept_a, kept_b, strict=True))}
            print(f"\nstep time {names[0]} / {names[1]}: logged {pair['logged_time_ratio']:.2f}x, "
                  f"harness {pair['harness_time_ratio']:.2f}x (same batches)")
    payload = {"benchmark": "train_throughput", "column": LOGGED_TOKENS_PER_S, "lora_alpha": LORA_ALPHA,
               "repeats": args.repeats, "malloc": args.malloc, "skip": args.skip, "tolerance": TOLERANCE,
               "runs": runs, "pair": pair, "load_avg_1m": [load0, os.getloadavg()[0]], "env": environment(device)}
    path = write_json(payload, args.out or f"train_throughput_{device.type}.json")
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
