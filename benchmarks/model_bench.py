"""A full training step of a pruned causal LM: SPP (every impl) vs peft LoRA r=8 vs the frozen model.

Run from the repository root: ``nice -n 10 python -m benchmarks.model_bench`` — the README main job's step
(``python train.py``: embedded SmolLM2-135M, 2:4, SPP r=16 vs LoRA r=8, dropout 0.05, the job's first Alpaca
batches of 8 records cut at 128 tokens, AdamW wd 0.001, fp32), at 1 and 2 threads. ``--from-config
<run>/resolved_config.yaml`` takes model, zero pattern, adapter, data and optimizer from a real run
(``lab.bench.step.StepSetting``), so the figure is the one that run experienced. ``--batch B --seq L`` times
random tokens of that shape instead (the earlier harness); ``--compile`` adds ``torch.compile``d LoRA and
SPP-fused variants; ``--autocast bf16`` runs every variant under CPU/GPU bf16 autocast.
Prints medians (wall time, process CPU time, peak memory, tokens/s) as ratios to LoRA and writes
``experiments/results/model_bench_job_<device>.json`` (``model_bench_<device>.json`` with ``--batch/--seq``).

A step is: forward with labels (causal LM loss), backward, AdamW step, ``zero_grad(set_to_none=True)``; the
variants alternate step by step in one process. "frozen" has no adapter; its input embeddings require grad so
that the backward still runs through every layer (the cost every adapter method pays on top of its own work).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
from collections.abc import Callable
from typing import Any

import torch
from rich.progress import Progress
from torch import nn

from lab.bench.common import (
    add_malloc_option,
    add_ratios,
    apply_malloc,
    environment,
    interleaved,
    markdown,
    measure,
    trim_heap,
    write_json,
)
from lab.bench.step import StepSetting, batch_tokens, load_pruned, make_step, training_batches
from lab.bench.variants import LORA_R, lora_model
from spp import DEFAULT_TARGETS, IMPLS, inject


@torch.no_grad()
def magnitude_2_4_(model: nn.Module, targets: tuple[str, ...] = DEFAULT_TARGETS) -> int:
    """Keep the 2 largest |w| of every 4 consecutive inputs in each target linear; returns layers pruned."""
    count = 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            w = mod.weight
            groups = w.abs().reshape(w.shape[0], -1, 4)
            keep = groups.argsort(dim=-1, descending=True)[..., :2]
            mask = torch.zeros_like(groups).scatter_(-1, keep, 1.0).reshape(w.shape)
            w.mul_(mask)
            count += 1
    return count


def build_variants(base: nn.Module, dropout: float, impls: list[str], compile_: bool, r: int = 16,
                   targets: tuple[str, ...] = DEFAULT_TARGETS, scale: float = 2.0,
                   frozen: bool = True) -> dict[str, nn.Module]:
    """Independent copies of ``base``: frozen, LoRA r=8, and SPP (rank ``r``) with each impl (optionally compiled)."""
    out: dict[str, nn.Module] = {}
    if frozen:
        fz = copy.deepcopy(base)
        for p in fz.parameters():
            p.requires_grad_(False)
        fz.enable_input_require_grads()
        out["frozen"] = fz
    out["lora"] = lora_model(copy.deepcopy(base), targets, dropout)
    for impl in impls:
        out[f"spp-{impl}"] = inject(copy.deepcopy(base), targets=targets, r=r, scale=scale, dropout=dropout,
                                    impl=impl)
    if compile_:
        out["lora+compile"] = torch.compile(lora_model(copy.deepcopy(base), targets, dropout))
        out["spp-fused+compile"] = torch.compile(inject(copy.deepcopy(base), targets=targets, r=r, scale=scale,
                                                        dropout=dropout, impl="fused"))
    for m in out.values():
        m.train()
    return out


def with_autocast(step: Callable[[], None], device: torch.device, dtype: torch.dtype | None) -> Callable[[], None]:
    """``step`` run under ``torch.autocast(device, dtype)`` (forward only; backward follows autocast's casts)."""
    if dtype is None:
        return step

    def run() -> None:
        with torch.autocast(device.type, dtype=dtype):
            step()

    return run


def memory_pass(steps: dict[str, Callable[[], None]], res: dict[str, dict[str, Any]], rounds: int = 2) -> None:
    """Replace the peaks in ``res`` by ``rounds`` more interleaved steps (the last counted), each after ``trim_heap``.

    The timing rounds run under glibc's own settings, as ``train.py`` does: the heap keeps freed blocks resident,
    so a step's RSS high-water mark would not show what it allocates. Trimming the heap before each step makes
    every page the step touches count, without the fixed 64 KiB mmap threshold of ``configure_malloc``
    (``MALLOC_HELP``). The heap's settings are unchanged, so later timing rounds are unaffected.
    """
    peaks: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            trim_heap()
            peaks[name].append(measure(step, torch.device("cpu"))[1])
    for name, r in res.items():
        r["peak_mib"], r["peaks_mib"] = peaks[name][-1], peaks[name]
        r["peak_source"] = "memory pass after the timing rounds: malloc_trim(0) before each step"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-config", default=None,
                        help="a run's resolved_config.yaml (python train.py writes it); default: the README main job")
    parser.add_argument("--batches", type=int, default=4, help="real training batches cycled through, step by step")
    parser.add_argument("--batch", type=int, default=None, help="random tokens instead: batch size (with --seq)")
    parser.add_argument("--seq", type=int, default=None, help="random tokens instead: sequence length")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dropout", type=float, nargs="+", default=None, help="default: the setting's dropout")
    parser.add_argument("--impls", nargs="+", default=["fused"], choices=list(IMPLS))
    parser.add_argument("--no-frozen", action="store_true", help="leave the frozen-model variant out")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd LoRA and SPP-fused")
    parser.add_argument("--autocast", default=None, choices=["bf16"], help="run every variant under bf16 autocast")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    add_malloc_option(parser)
    parser.add_argument("--out", default=None, help="JSON file name under experiments/results/ (or a path)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    apply_malloc(args.malloc)
    torch.manual_seed(0)
    setting = StepSetting.from_resolved_config(args.from_config) if args.from_config else StepSetting()
    if args.dtype or device.type == "cuda":
        setting.model.torch_dtype = args.dtype or "bfloat16"
    dtype = getattr(torch, setting.model.torch_dtype)
    base, tokenizer = load_pruned(setting)
    base.to(device)
    if args.batch or args.seq:
        shape = (args.batch or 4, args.seq or 256)
        ids = torch.randint(0, base.config.vocab_size, shape, generator=torch.Generator().manual_seed(0))
        batches = [{"input_ids": ids, "labels": ids}]
    else:
        batches = training_batches(setting, tokenizer, args.batches)
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    tokens = statistics.mean(batch_tokens(b) for b in batches)
    positions = statistics.mean(int(b["input_ids"].numel()) for b in batches)
    autocast = torch.bfloat16 if args.autocast == "bf16" else None
    payload: dict[str, Any] = {"benchmark": "model_step", "setting": setting.describe(), "dtype": str(dtype),
                               "autocast": args.autocast, "malloc": args.malloc,
                               "batches": [list(b["input_ids"].shape) for b in batches],
                               "tokens_per_step": tokens, "positions_per_step": positions,
                               "repeats": args.repeats, "warmup": args.warmup, "lora_r": LORA_R,
                               "memory": "peak RSS delta per step (CPU; --malloc default: in a pass after the "
                                         "group's timing rounds) / max_memory_allocated delta (CUDA)",
                               "time": "wall seconds per step (time_s) and process CPU seconds (cpu_s), medians",
                               "env": environment(device), "results": {}}
    default = f"model_bench_{device.type}.json" if (args.batch or args.seq) else f"model_bench_job_{device.type}.json"
    out = args.out or default
    dropouts = args.dropout if args.dropout is not None else [setting.dropout]
    tables = []
    with Progress() as progress:
        for p in dropouts:
            variants = build_variants(base, p, args.impls, args.compile, setting.r, setting.targets, setting.scale,
                                      frozen=not args.no_frozen)
            for threads in args.threads if device.type == "cpu" else [torch.get_num_threads()]:
                torch.set_num_threads(threads)
                steps = {k: with_autocast(make_step(m, batches, lr=setting.lr, weight_decay=setting.weight_decay,
                                                    betas=setting.betas), device, autocast)
                         for k, m in variants.items()}
                warmup = args.warmup + (1 if args.compile else 0)
                task = progress.add_task(f"step p={p} threads={threads}", total=(warmup + args.repeats) * len(steps))
                load0 = os.getloadavg()[0]
                res = interleaved(steps, args.repeats, warmup, device,
                                  progress=lambda t=task: progress.advance(t))
                if args.malloc == "default" and device.type == "cpu":
                    memory_pass(steps, res)
                add_ratios(res, "lora")
                for r in res.values():
                    r["tokens_per_s"] = tokens / r["time_s"]
                    r["tokens_per_cpu_s"] = tokens / r["cpu_s"]
                key = f"p{p}" if len(args.threads) == 1 and device.type != "cpu" else f"p{p}_threads{threads}"
                payload["results"][key] = {"threads": threads, "load_avg_1m_start": load0,
                                           "load_avg_1m_end": os.getloadavg()[0], **res}
                title = (f"{setting.model.name}, {len(batches)} batch(es) of {positions:.0f} positions "
                         f"({tokens:.0f} tokens), dropout {p}, {dtype}{' + bf16 autocast' if autocast else ''}, "
                         f"{threads} thread(s), load {load0:.2f}→{os.getloadavg()[0]:.2f}")
                tables.append(markdown(res, title))
                progress.console.print(tables[-1] + "\n")
                write_json(payload, out)  # after every group, so an interrupted run keeps what it measured
                del steps
            del variants
            gc.collect()
    print("\n\n".join(tables))
    path = write_json(payload, out)
    print(f"\nwrote {path}")
    return payload


if __name__ == "__main__":
    main()
