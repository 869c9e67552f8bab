"""Where one training step's time goes: SPP-fused vs peft LoRA r=8 vs the frozen model, part by part.

Run from the repository root: ``nice -n 10 python -m benchmarks.profile_step`` (the README main job's step:
embedded SmolLM2-135M, 2:4, SPP r=16 / LoRA r=8, dropout 0.05, the job's first Alpaca batches of 8 x <= 128
tokens, AdamW; 1 and 2 threads; about 5 min on 2 CPU cores). ``--from-config <run>/resolved_config.yaml``
takes the step from a real run instead.

``torch.profiler`` records every op of ``--steps`` steps (after one warm-up step) and each op's self time is
attributed to one part: the full-size products (base forward, base input gradient, SPP's adapter forward,
adapter input gradient and ``G = g^T x``), the elementwise passes over m x n (building ``W_eff``/``W'``,
``G ⊙ W``), the alpha/beta reductions, LoRA's rank-8 products, dropout, attention, the LM head products and
its loss, the optimizer and everything else. The variants alternate step by step, so load hits them alike.
Writes ``experiments/results/profile_step_<device>.json`` and prints one Markdown table per thread count.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from collections import defaultdict
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from lab.bench.common import add_malloc_option, apply_malloc, environment, write_json
from lab.bench.step import StepSetting, load_pruned, make_step, training_batches
from lab.bench.variants import lora_model
from spp.adapters.methods.spp.model import inject

PARTS: tuple[str, ...] = (
    "base fwd product (x W^T)",
    "base input-grad product (g W)",
    "SPP merged fwd product (x W_eff^T, no dropout)",
    "SPP merged input-grad product (g W_eff, no dropout)",
    "SPP adapter fwd product (xd W'^T)",
    "SPP adapter input-grad product (g W')",
    "SPP G = g^T xd product",
    "SPP elementwise m x n: build W_eff / W'",
    "SPP elementwise m x n: G ⊙ W",
    "SPP alpha/beta reductions (bmm)",
    "SPP other (casts, copies)",
    "LoRA rank-8 products",
    "dropout (RNG, mask, backward)",
    "attention (SDPA fwd+bwd)",
    "LM head products",
    "LM head loss (log-softmax, NLL)",
    "optimizer (AdamW step, zero_grad)",
    "other (norms, RoPE, SiLU, residual adds, LoRA scale/add, autograd)",
)
PRODUCT_OPS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::matmul", "aten::linear", "aten::bmm")


def _shapes(ev: Any) -> list[list[int]]:
    return [list(s) for s in (ev.input_shapes or []) if isinstance(s, list | tuple)]


def _has_dim(ev: Any, value: int) -> bool:
    return any(value in s for s in _shapes(ev))


class Attributor:
    """Assigns each profiler event's self time to one of ``PARTS`` from its name, shapes and ancestors."""

    def __init__(self, vocab: int, lora_r: int, dropout: bool, tokens: int) -> None:
        self.vocab, self.lora_r, self.dropout, self.tokens = vocab, lora_r, dropout, tokens
        self.totals: dict[str, float] = defaultdict(float)
        self._spp_state: dict[int, dict[str, Any]] = {}

    def _spp_part(self, ev: Any, node: Any, backward: bool) -> str:
        """Parts inside SPPFusedFunction's forward / backward (see ``spp/adapters/methods/spp/functional.py``)."""
        st = self._spp_state.setdefault(id(node), {"mm": 0, "after_g": False})
        name = ev.name
        if name in ("aten::mm", "aten::addmm_", "aten::addmm"):
            if not backward:
                if name == "aten::mm":
                    merged = "SPP merged fwd product (x W_eff^T, no dropout)"
                    return "base fwd product (x W^T)" if self.dropout else merged
                return "SPP adapter fwd product (xd W'^T)"
            shapes = _shapes(ev)
            first = shapes[0] if shapes else []
            if len(first) == 2 and first[1] == self.tokens and first[0] != self.tokens:  # (m x N) @ (N x n)
                st["after_g"] = True
                return "SPP G = g^T xd product"
            st["mm"] += 1
            st["after_g"] = False
            if not self.dropout:
                return "SPP merged input-grad product (g W_eff, no dropout)"
            if st["mm"] == 1 and name == "aten::mm":
                return "base input-grad product (g W)"
            return "SPP adapter input-grad product (g W')"
        if name == "aten::bmm":
            st["after_g"] = False
            return "SPP alpha/beta reductions (bmm)"
        if name in ("aten::mul", "aten::mul_", "aten::addcmul", "aten::addcmul_"):
            if backward and st["after_g"] and name == "aten::mul_":
                st["after_g"] = False
                return "SPP elementwise m x n: G ⊙ W"
            shapes = _shapes(ev)
            if shapes and len(shapes[0]) >= 2 and shapes[0][-1] != 1:
                return "SPP elementwise m x n: build W_eff / W'"
        return "SPP other (casts, copies)"

    def add(self, ev: Any, ancestors: list[Any]) -> None:
        t = ev.self_cpu_time_total / 1e3  # ms
        if t <= 0:
            return
        names = [a.name for a in ancestors]
        self.totals[self.part(ev, ancestors, names)] += t

    def part(self, ev: Any, ancestors: list[Any], names: list[str]) -> str:
        name = ev.name
        low = [n.lower() for n in names] + [name.lower()]
        if any(n.startswith("optimizer.") for n in low):
            return "optimizer (AdamW step, zero_grad)"
        for a in reversed(ancestors):  # nearest SPP node wins
            if a.name == "SPPFusedFunction":
                return self._spp_part(ev, a, backward=False)
            if a.name.startswith("SPPFusedFunctionBackward") or a.name.endswith("SPPFusedFunctionBackward"):
                return self._spp_part(ev, a, backward=True)
        if any("dropout" in n or "bernoulli" in n for n in low):
            return "dropout (RNG, mask, backward)"
        if any("scaled_dot_product" in n or "_flash_attention" in n for n in low):
            return "attention (SDPA fwd+bwd)"
        if name in PRODUCT_OPS:
            if _has_dim(ev, self.vocab):
                return "LM head products"
            if _has_dim(ev, self.lora_r) or name == "aten::bmm":
                return "LoRA rank-8 products"
            backward = any("backward" in n for n in low)
            return "base input-grad product (g W)" if backward else "base fwd product (x W^T)"
        if "softmax" in name or "nll_loss" in name or (_has_dim(ev, self.vocab) and name != "aten::embedding"):
            return "LM head loss (log-softmax, NLL)"
        return "other (norms, RoPE, SiLU, residual adds, LoRA scale/add, autograd)"


def attribute(prof: Any, vocab: int, lora_r: int, dropout: bool, tokens: int, steps: int) -> dict[str, float]:
    """Per-step milliseconds per part from a finished ``torch.profiler.profile``."""
    att = Attributor(vocab, lora_r, dropout, tokens)
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    for ev in events:
        chain = []
        p = ev.cpu_parent
        while p is not None:
            chain.append(p)
            p = p.cpu_parent
        att.add(ev, list(reversed(chain)))
    return {k: v / steps for k, v in att.totals.items()}


def build(setting: StepSetting, base: nn.Module) -> dict[str, nn.Module]:
    """frozen, LoRA r=8 and SPP-fused copies of the pruned ``base`` (same dropout as the setting)."""
    frozen = copy.deepcopy(base)
    for p in frozen.parameters():
        p.requires_grad_(False)
    frozen.enable_input_require_grads()
    out = {"frozen": frozen,
           "lora": lora_model(copy.deepcopy(base), setting.targets, setting.dropout),
           "spp-fused": inject(copy.deepcopy(base), targets=setting.targets, r=setting.r, scale=setting.scale,
                               dropout=setting.dropout, impl="fused")}
    for m in out.values():
        m.train()
    return out


FLOOR_PARTS: tuple[str, ...] = ("dropout (RNG, mask, backward)", "SPP adapter fwd product (xd W'^T)",
                                 "SPP adapter input-grad product (g W')", "SPP G = g^T xd product")
"""What an exact SPP step must add to the frozen model's step: dropout, and the products no rearrangement merges
(with dropout: ``xd W'^T``, ``g W'``, ``G``; without: ``G`` alone, the merged products replacing the base ones)."""


def floor(parts: dict[str, dict[str, float]]) -> dict[str, float]:
    """The floor of an exact SPP step under the profiler, and SPP-fused's work above it (ms and ratio).

    ``floor_ms`` = frozen total + SPP's ``FLOOR_PARTS``; ``extras_ms`` = SPP-fused total − floor (building ``W'``,
    ``G ⊙ W``, the α/β reductions, its autograd node: what an ideal kernel could still remove). The profiler adds
    a fixed cost per op, which inflates LoRA's many small ops far more than SPP's few large ones, so a LoRA ratio
    is taken from the unprofiled ``model_bench`` step, not from here.
    """
    spp = parts["spp-fused"]
    floor_ms = parts["frozen"]["total"] + sum(spp.get(k, 0.0) for k in FLOOR_PARTS)
    return {"floor_ms": floor_ms, "extras_ms": spp["total"] - floor_ms, "spp_over_floor": spp["total"] / floor_ms,
            "adapter_products_ms": sum(spp.get(k, 0.0) for k in FLOOR_PARTS[1:])}


def markdown(parts: dict[str, dict[str, float]], threads: int, load: list[float],
             fl: dict[str, float] | None = None) -> str:
    """One table: ms per step per part and variant, plus the share of the SPP step."""
    names = list(parts)
    lines = [f"**{threads} thread(s), load avg {load[0]:.2f}→{load[1]:.2f}**", "",
             "| part | " + " | ".join(f"{n} (ms)" for n in names) + " | SPP − LoRA (ms) |",
             "|---|" + "---:|" * (len(names) + 1)]
    for part in (*PARTS, "total"):
        vals = [parts[n].get(part, 0.0) for n in names]
        if part != "total" and not any(v >= 0.5 for v in vals):
            continue
        diff = parts.get("spp-fused", {}).get(part, 0.0) - parts.get("lora", {}).get(part, 0.0)
        cells = " | ".join(f"{v:,.0f}" for v in vals)
        label = f"**{part}**" if part == "total" else part
        lines.append(f"| {label} | {cells} | {diff:+,.0f} |")
    if fl is not None:
        lines += ["", f"Floor of an exact SPP step (frozen + dropout + the adapter products, "
                      f"{fl['adapter_products_ms']:,.0f} ms of them): {fl['floor_ms']:,.0f} ms; SPP-fused is "
                      f"{fl['extras_ms']:+,.0f} ms = {fl['spp_over_floor']:.2f}× its floor (profiled)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-config", default=None, help="a run's resolved_config.yaml (default: README main job)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=2, help="profiled steps per variant (after 1 warm-up)")
    parser.add_argument("--variants", nargs="+", default=["frozen", "lora", "spp-fused"])
    add_malloc_option(parser)
    parser.add_argument("--out", default=None, help="JSON file name under experiments/results/ (or a path)")
    args = parser.parse_args(argv)
    apply_malloc(args.malloc)
    setting = StepSetting.from_resolved_config(args.from_config) if args.from_config else StepSetting()
    torch.manual_seed(0)
    base, tokenizer = load_pruned(setting)
    batches = training_batches(setting, tokenizer, args.steps)
    tokens = int(batches[0]["input_ids"].numel())
    if any(int(b["input_ids"].numel()) != tokens for b in batches):
        batches = [batches[0]] * args.steps  # one shape, so the G product is recognised by its token dimension
    variants = {k: v for k, v in build(setting, base).items() if k in args.variants}
    payload: dict[str, Any] = {"benchmark": "profile_step", "setting": setting.describe(), "malloc": args.malloc,
                               "positions_per_step": tokens, "profiled_steps": args.steps,
                               "parts": list(PARTS), "results": {}}
    tables = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        load0 = os.getloadavg()[0]
        steps = {k: make_step(m, batches, lr=setting.lr, weight_decay=setting.weight_decay, betas=setting.betas)
                 for k, m in variants.items()}
        for st in steps.values():
            st()  # warm-up
        parts: dict[str, dict[str, float]] = {k: defaultdict(float) for k in steps}
        wall: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(args.steps):
            for name, st in steps.items():
                t0 = time.perf_counter()
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    st()
                wall[name].append(time.perf_counter() - t0)
                dropout = setting.dropout > 0 and name != "frozen"
                for k, v in attribute(prof, base.config.vocab_size, 8, dropout, tokens, args.steps).items():
                    parts[name][k] += v
        for name in parts:
            parts[name]["total"] = sum(v for k, v in parts[name].items() if k != "total")
        load = [load0, os.getloadavg()[0]]
        payload["results"][f"threads{threads}"] = {
            "parts_ms": {k: dict(v) for k, v in parts.items()},
            "profiled_wall_s": wall, "load_avg_1m": load, "env": environment(torch.device("cpu")),
        }
        fl = floor(parts) if {"frozen", "spp-fused"} <= set(parts) else None
        payload["results"][f"threads{threads}"]["floor"] = fl
        tables.append(markdown(parts, threads, load, fl))
        print(tables[-1] + "\n", flush=True)
        write_json(payload, args.out or "profile_step_cpu.json")  # after every thread count
    path = write_json(payload, args.out or "profile_step_cpu.json")
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
