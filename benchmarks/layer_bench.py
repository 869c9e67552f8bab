"""One adapted linear layer, forward + backward: every SPP impl vs peft LoRA r=8.

Run: ``nice -n 10 python -m benchmarks.layer_bench`` (about 10 min on 2 CPU cores). Prints medians of time
and peak memory (RSS delta, see ``lab/bench/common.py``) as ratios to LoRA, interleaved in one process, and
writes ``experiments/results/layer_bench_<device>.json``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from rich.progress import Progress
from torch import nn

from lab.bench.common import (
    add_ratios,
    configure_malloc,
    environment,
    interleaved,
    markdown,
    write_json,
)
from lab.bench.variants import layer_variants

LLAMA7B_SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008))  # (out, in): q/k/v/o, gate/up, down


def pruned_base(out_f: int, in_f: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> nn.Linear:
    """A frozen linear layer with a 2:4 magnitude mask (the values do not change dense CPU/GPU cost)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=gen) * in_f**-0.5
    groups = w.abs().reshape(out_f, -1, 4)
    keep = groups.argsort(dim=-1, descending=True)[..., :2]
    w = (w.reshape(out_f, -1, 4) * torch.zeros_like(groups).scatter_(-1, keep, 1.0)).reshape(out_f, in_f)
    lin = nn.Linear(in_f, out_f, bias=False, device=device, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    lin.weight.requires_grad_(False)
    return lin


def bench_shape(out_f: int, in_f: int, tokens: int, dropout: float, repeats: int, warmup: int,
                dtype: torch.dtype, device: torch.device, progress: Any,
                compile_: bool = False) -> dict[str, dict[str, Any]]:
    """Interleaved fwd+bwd of every variant on one shape; ratios to LoRA."""
    base = pruned_base(out_f, in_f, dtype, device)
    variants = layer_variants(base, dropout)
    for v in variants.values():
        v.to(device=device, dtype=dtype).train()
    if compile_:
        variants["lora+compile"] = torch.compile(variants["lora"])
        variants["spp-fused+compile"] = torch.compile(variants["spp-fused"])
        warmup += 1
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(tokens, in_f, generator=gen, device=device, dtype=dtype).requires_grad_(True)
    gy = torch.randn(tokens, out_f, generator=gen, device=device, dtype=dtype)

    def make_step(layer: nn.Module):
        params = [p for p in layer.parameters() if p.requires_grad]

        def step() -> None:
            x.grad = None
            for p in params:
                p.grad = None
            layer(x).backward(gy)

        return step

    task = progress.add_task(f"{out_f}x{in_f} p={dropout}", total=(warmup + repeats) * len(variants))
    res = interleaved({k: make_step(v) for k, v in variants.items()}, repeats, warmup, device,
                      progress=lambda: progress.advance(task))
    add_ratios(res, "lora")
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.0, 0.05])
    parser.add_argument("--shapes", nargs="+", default=[f"{o}x{i}" for o, i in LLAMA7B_SHAPES],
                        help="out x in, e.g. 4096x11008")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    parser.add_argument("--compile", action="store_true", help="add torch.compile'd LoRA and SPP-fused")
    parser.add_argument("--out", default=None, help="JSON file name under experiments/results/")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    configure_malloc()
    payload: dict[str, Any] = {"benchmark": "layer", "tokens": args.tokens, "repeats": args.repeats,
                               "warmup": args.warmup, "dtype": str(dtype), "spp_r": 16, "lora_r": 8,
                               "memory": "peak RSS delta per step (CPU) / max_memory_allocated delta (CUDA)",
                               "env": environment(device), "results": {}}
    tables = []
    with Progress() as progress:
        for p in args.dropout:
            for shape in args.shapes:
                out_f, in_f = (int(v) for v in shape.split("x"))
                res = bench_shape(out_f, in_f, args.tokens, p, args.repeats, args.warmup, dtype, device, progress,
                                  compile_=args.compile)
                key = f"{shape}_p{p}"
                payload["results"][key] = res
                tables.append(markdown(res, f"{shape} (out x in), {args.tokens} tokens, dropout {p}, {dtype}"))
                progress.console.print(tables[-1] + "\n")
    print("\n\n".join(tables))
    path = write_json(payload, args.out or f"layer_bench_{device.type}.json")
    print(f"\nwrote {path}")
    return payload


if __name__ == "__main__":
    main()
