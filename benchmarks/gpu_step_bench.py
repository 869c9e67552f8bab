"""Training-step cost at LLaMA-7B shape on a GPU: frozen vs peft LoRA r=8 vs SPP r=16.

Run (CUDA): ``python -m benchmarks.gpu_step_bench`` (LLaMA-7B shape cut to 2 and 4 of its 32
decoder blocks, random weights 2:4-pruned by magnitude, bf16 weights, fp32 adapters, ``torch.autocast`` bf16 as
Lightning's ``bf16-mixed``; sequence 2048, batch 1 and 4, gradient checkpointing off and on, dropout 0 and 0.05)
plus one layer at a time for 4096x4096, 11008x4096 and 4096x11008, and a kernel profile of LoRA vs SPP-fused.
Writes ``experiments/results/gpu_step_<shape>.json``; ``--profile-only --batch 1 4`` writes only the kernel
profiles. Without CUDA it prints why it skips and exits
(``--device cpu --shape tiny`` runs the same code on CPU for development).

A step is forward with labels (causal-LM loss), backward, AdamW, ``zero_grad(set_to_none=True)``. All variants
share the same frozen weight tensors in one process and are timed round-robin (``benchmarks.common``); the time
and peak memory (``max_memory_allocated`` over the level before the step) are ratios to LoRA.

The **matmul floor** of a variant (printed beside each ratio) counts full-size matrix products as
``tokens x in x out`` multiply-adds: per adapted linear LoRA and the frozen model 2 (forward, input gradient),
SPP 3 without dropout (``x W_eff^T``, ``g W_eff``, ``g^T x``) and 5 with dropout (``x W^T``, ``xd W'^T``, ``g W``,
``g W'``, ``g^T xd``); gradient checkpointing adds the forward products again inside the decoder blocks. Shared
by every variant: attention (2 forward + 4 backward products of ``seq x seq x hidden`` per sequence and block,
counted without a causal discount, as in the 1.4x / 2.3x expected at 7B) and the LM head (forward and input
gradient). The floor ratio is that count over LoRA's count, i.e. the ratio a step limited only by its matrix
products would show. Elementwise work (norms, SiLU, the m x n scaling that rebuilds SPP's W_eff) is not in it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from benchmarks.layer_bench import pruned_base
from lab.bench.common import add_ratios, environment, interleaved, write_json
from lab.bench.variants import LORA_ALPHA, LORA_R, layer_variants, lora_model
from spp.adapters.methods.spp.layer import IMPLS
from spp.adapters.methods.spp.model import inject
from spp.projections import DEFAULT_TARGETS

SPP_R = 16
CUDA_NOTE = ("skipped: no CUDA device. This benchmark measures GPU training steps at LLaMA-7B shape in bf16; "
             "run it on a CUDA machine (or pass --device cpu --shape tiny for a development run).")


@dataclass(frozen=True)
class Arch:
    """The dimensions of a LLaMA decoder that the step cost depends on."""

    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    layers: int

    @property
    def kv_dim(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(out, in) of the 7 adapted projections of one decoder block (q, k, v, o, gate, up, down)."""
        h, f, kv = self.hidden, self.ffn, self.kv_dim
        return [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f)]

    def params(self, blocks: int | None = None) -> int:
        """Parameter count of the model with ``blocks`` decoder blocks (untied embeddings, no biases)."""
        nb = self.layers if blocks is None else blocks
        per_block = sum(o * i for o, i in self.linear_shapes()) + 2 * self.hidden
        return 2 * self.vocab * self.hidden + nb * per_block + self.hidden


SHAPES: dict[str, Arch] = {
    "7b": Arch(hidden=4096, ffn=11008, heads=32, kv_heads=32, vocab=32000, layers=32),
    "13b": Arch(hidden=5120, ffn=13824, heads=40, kv_heads=40, vocab=32000, layers=40),
    "tiny": Arch(hidden=64, ffn=128, heads=4, kv_heads=2, vocab=260, layers=2),
}
LAYER_SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008))


# ---------------------------------------------------------------------------------------------- the floor
def products_per_linear(variant: str, dropout: float, checkpointing: bool = False) -> int:
    """Full-size products per adapted linear per step (see the module docstring)."""
    method = variant.split("-")[0]
    if method in ("lora", "frozen"):
        fwd, bwd = 1, 1
    elif method == "sparse_lora":  # x W^T, xd ((B A) ⊙ M)^T; g W, g ((B A) ⊙ M), g^T xd (whatever the dropout)
        fwd, bwd = 2, 3
    elif method == "spp":
        fwd, bwd = (2, 3) if dropout > 0 else (1, 2)
    else:
        raise ValueError(f"no floor for variant {variant!r}; known methods: frozen, lora, sparse_lora, spp-<impl>.")
    return fwd + bwd + (fwd if checkpointing else 0)


def step_macs(arch: Arch, blocks: int, batch: int, seq: int, variant: str, dropout: float,
              checkpointing: bool) -> float:
    """Multiply-adds of the full-size matrix products of one training step (the floor's numerator)."""
    tokens = batch * seq
    lin = sum(o * i for o, i in arch.linear_shapes())  # per token per block, one product each
    attn_products = 6 + (2 if checkpointing else 0)  # QK^T, PV forward; 4 backward; recomputed forward
    attn = seq * arch.hidden  # per token per block per product (seq x seq x hidden per sequence)
    per_block = lin * products_per_linear(variant, dropout, checkpointing) + attn * attn_products
    return float(tokens) * (blocks * per_block + 2 * arch.vocab * arch.hidden)


def floor_ratio(arch: Arch, blocks: int, batch: int, seq: int, variant: str, dropout: float,
                checkpointing: bool) -> float:
    """The variant's matmul floor as a ratio to LoRA's at the same shape."""
    return (step_macs(arch, blocks, batch, seq, variant, dropout, checkpointing)
            / step_macs(arch, blocks, batch, seq, "lora", dropout, checkpointing))


def layer_floor_ratio(variant: str, dropout: float) -> float:
    """Floor ratio to LoRA of one layer's forward + backward (products per layer only)."""
    return products_per_linear(variant, dropout) / products_per_linear("lora", dropout)


# ---------------------------------------------------------------------------------------------- models
@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create tensors in ``dtype`` (so a 7B-shape model is built in bf16 directly, not in fp32 first)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def cut_model(arch: Arch, blocks: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> nn.Module:
    """A random LLaMA of shape ``arch`` with ``blocks`` decoder blocks, 2:4 magnitude-pruned, frozen."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=arch.hidden, intermediate_size=arch.ffn, num_attention_heads=arch.heads,
                         num_key_value_heads=arch.kv_heads, vocab_size=arch.vocab, num_hidden_layers=blocks,
                         max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         attn_implementation="sdpa")
    torch.manual_seed(seed)
    with default_dtype(dtype), torch.device(device):
        model = LlamaForCausalLM(config)
    magnitude_2_4_(model)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@torch.no_grad()
def magnitude_2_4_(model: nn.Module, targets: tuple[str, ...] = DEFAULT_TARGETS) -> int:
    """Zero the 2 smallest |w| of every 4 consecutive inputs of each target linear (``spp.pruning`` needs
    omegaconf, which the GPU machines lack); returns the number of layers pruned."""
    count = 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            w = mod.weight
            groups = w.abs().reshape(w.shape[0], -1, 4)
            drop = groups.argsort(dim=-1)[..., :2]
            w.view(w.shape[0], -1, 4).scatter_(-1, drop, 0.0)
            count += 1
    return count


def share_copy(model: nn.Module) -> nn.Module:
    """A deep copy of the module tree that shares every parameter and buffer tensor with ``model``."""
    memo: dict[int, Any] = {id(p): p for p in model.parameters()}
    memo.update({id(b): b for b in model.buffers()})
    return copy.deepcopy(model, memo)


def sparse_lora_module() -> Any | None:
    """``spp.adapters.methods.sparse_lora.layer`` (SparsePEFT) where it exists in this checkout, else None."""
    try:
        return importlib.import_module("spp.adapters.methods.sparse_lora.layer")
    except ImportError:
        return None


def variant_names(impls: list[str], sparse_lora: bool = False) -> list[str]:
    return ["frozen", "lora"] + (["sparse_lora"] if sparse_lora else []) + [f"spp-{i}" for i in impls]


def build_variants(base: nn.Module, dropout: float, impls: list[str], checkpointing: bool,
                   sparse_lora: bool = False) -> dict[str, nn.Module]:
    """frozen, peft LoRA r=8, SparsePEFT r=8 (if asked) and SPP r=16 (each impl) on shared frozen weights;
    adapters in fp32."""
    out: dict[str, nn.Module] = {}
    for name in variant_names(impls, sparse_lora):
        m = share_copy(base)
        if checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if name == "frozen":
            m.enable_input_require_grads()  # backward through every block, as every adapter pays it
        elif name == "lora":
            m = lora_model(m, DEFAULT_TARGETS, dropout)
        elif name == "sparse_lora":
            m = sparse_lora_module().inject_sparse_lora(m, None, DEFAULT_TARGETS, r=LORA_R, alpha=LORA_ALPHA,
                                                        dropout=dropout, dtype=torch.float32)
        else:
            m = inject(m, r=SPP_R, dropout=dropout, impl=name.split("-", 1)[1])
        out[name] = m.train()
    return out


def make_step(model: nn.Module, batch: dict[str, torch.Tensor], autocast: torch.dtype | None) -> Callable[[], None]:
    """One optimisation step: autocast forward with labels, backward, AdamW, zero_grad(set_to_none)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4) if params else None
    dev = batch["input_ids"].device.type

    def step() -> None:
        with torch.autocast(dev, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            loss = model(**batch).loss
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------------------------- profile
def kernel_category(name: str) -> str:
    """Rough class of a CUDA kernel by its name: gemm, attention or other (elementwise, reductions, copies)."""
    n = name.lower()
    if any(s in n for s in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(s in n for s in ("gemm", "cutlass", "cublas", "nvjet", "xmma", "wgmma", "matmul", "gemv", "splitk")):
        return "gemm"
    return "other"


def summarize_kernels(kernel_us: dict[str, float], steps: int, top: int = 12) -> dict[str, Any]:
    """Per-step milliseconds by category and the ``top`` kernels, from ``{kernel name: total microseconds}``."""
    cats: dict[str, float] = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for name, us in kernel_us.items():
        cats[kernel_category(name)] += us / 1000 / steps
    ranked = sorted(kernel_us.items(), key=lambda kv: -kv[1])[:top]
    return {"ms_per_step": cats, "total_ms": sum(cats.values()),
            "top_kernels": [{"name": k[:160], "ms_per_step": v / 1000 / steps,
                             "category": kernel_category(k)} for k, v in ranked]}


def profile_kernels(step: Callable[[], None], steps: int = 3) -> dict[str, Any]:
    """CUDA kernel time of ``steps`` calls of ``step`` (after one warm-up call), summarised by category."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernel_us: dict[str, float] = {}
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", None)
        if us is None:
            us = getattr(evt, "self_cuda_time_total", 0.0)
        if us and evt.device_type == torch.autograd.DeviceType.CUDA:
            kernel_us[evt.key] = kernel_us.get(evt.key, 0.0) + float(us)
    return summarize_kernels(kernel_us, steps)


# ---------------------------------------------------------------------------------------------- measurements
def measure_model(arch: Arch, blocks: int, batches: list[int], seq: int, checkpointing: list[bool],
                  dropouts: list[float], impls: list[str], repeats: int, warmup: int, dtype: torch.dtype,
                  autocast: torch.dtype | None, device: torch.device, log: Callable[[str], None],
                  sparse_lora: bool = False) -> dict[str, Any]:
    """Every (batch, checkpointing, dropout) group on one cut model; ratios to LoRA and floors."""
    base = cut_model(arch, blocks, dtype, device)
    out: dict[str, Any] = {}
    for batch in batches:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, arch.vocab, (batch, seq), generator=gen).to(device)
        for ckpt in checkpointing:
            for p in dropouts:
                key = f"b{batch}_ckpt{int(ckpt)}_p{p}"
                variants = build_variants(base, p, impls, ckpt, sparse_lora)
                steps = {k: make_step(m, {"input_ids": ids, "labels": ids}, autocast) for k, m in variants.items()}
                res = interleaved(steps, repeats, warmup, device)
                add_ratios(res, "lora")
                for name, r in res.items():
                    macs = step_macs(arch, blocks, batch, seq, name, p, ckpt)
                    r["floor_ratio"] = floor_ratio(arch, blocks, batch, seq, name, p, ckpt)
                    r["time_over_floor"] = r["time_ratio"] / r["floor_ratio"]
                    r["matmul_tflops"] = 2 * macs / r["time_s"] / 1e12
                    r["tokens_per_s"] = batch * seq / r["time_s"]
                    r["trainable_params"] = trainable(variants[name])
                add_rate_floor(res)
                out[key] = {"blocks": blocks, "batch": batch, "seq": seq, "checkpointing": ckpt, "dropout": p,
                            "results": res}
                log(table(res, f"{blocks} blocks, batch {batch} x {seq}, checkpointing {ckpt}, dropout {p}"))
                del variants, steps, res
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    del base
    gc.collect()
    return out


def add_rate_floor(results: dict[str, dict[str, Any]]) -> None:
    """``time_over_frozen_rate``: step time over the variant's matmul work done at the frozen model's achieved
    matmul rate in the same group (1.0 = as efficient as the frozen step; the LoRA-relative floor ratio hides
    that LoRA itself runs below the frozen rate)."""
    if "frozen" not in results:
        return
    rate = results["frozen"]["matmul_tflops"]
    for r in results.values():
        r["time_over_frozen_rate"] = rate / r["matmul_tflops"]


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def extrapolate(groups: dict[int, dict[str, Any]], arch: Arch, dtype: torch.dtype) -> dict[str, Any]:
    """Full-model (all ``arch.layers`` blocks) step time and peak memory, linear in the block count.

    From the two largest measured block counts b1 < b2: ``x(L) = x(b2) + (x(b2) - x(b1)) / (b2 - b1) * (L - b2)``
    for the step time and the step's extra memory; the total peak adds the full model's weights (``dtype``) and
    each variant's own adapter parameters with their AdamW states (fp32: 4 + 8 bytes each). Extrapolated, not
    measured.
    """
    b1, b2 = sorted(groups)[-2:]
    full = arch.layers
    wbytes = torch.tensor([], dtype=dtype).element_size()
    weights_mib = arch.params() * wbytes / 2**20
    out: dict[str, Any] = {"from_blocks": [b1, b2], "to_blocks": full, "weights_mib": weights_mib,
                           "note": "extrapolated linearly in the number of decoder blocks, not measured"}
    for key, g2 in groups[b2].items():
        g1 = groups[b1][key]
        rows: dict[str, Any] = {}
        for name, r2 in g2["results"].items():
            r1 = g1["results"][name]
            t = r2["time_s"] + (r2["time_s"] - r1["time_s"]) / (b2 - b1) * (full - b2)
            step_mib = r2["peak_mib"] + (r2["peak_mib"] - r1["peak_mib"]) / (b2 - b1) * (full - b2)
            adapter = r2["trainable_params"] / b2 * full
            rows[name] = {"time_s": t, "step_peak_mib": step_mib,
                          "total_peak_mib": weights_mib + adapter * 12 / 2**20 + step_mib}
        ref = rows["lora"]
        for name, r in rows.items():
            r["time_ratio"] = r["time_s"] / ref["time_s"]
            r["step_mem_ratio"] = ratio(r["step_peak_mib"], ref["step_peak_mib"])
            r["total_mem_ratio"] = ratio(r["total_peak_mib"], ref["total_peak_mib"])
            r["floor_ratio"] = floor_ratio(arch, full, g2["batch"], g2["seq"], name, g2["dropout"],
                                           g2["checkpointing"])
            r["time_over_floor"] = r["time_ratio"] / r["floor_ratio"]
        out[key] = rows
    return out


def measure_layers(shapes: list[tuple[int, int]], tokens_list: list[int], dropouts: list[float], impls: list[str],
                   repeats: int, warmup: int, dtype: torch.dtype, autocast: torch.dtype | None,
                   device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """One adapted layer, forward + backward (input grad too), every variant; ratios to LoRA and floors."""
    out: dict[str, Any] = {}
    for out_f, in_f in shapes:
        base = pruned_base(out_f, in_f, dtype, device)
        for tokens in tokens_list:
            gen = torch.Generator(device=device).manual_seed(1)
            x = torch.randn(tokens, in_f, generator=gen, device=device, dtype=dtype).requires_grad_(True)
            gy = torch.randn(tokens, out_f, generator=gen, device=device, dtype=dtype)
            for p in dropouts:
                variants = {k: v for k, v in layer_variants(base, p, r=SPP_R, impls=impls).items()}
                for v in variants.values():
                    v.to(device).train()

                def make(layer: nn.Module, x: torch.Tensor = x, gy: torch.Tensor = gy) -> Callable[[], None]:
                    params = [q for q in layer.parameters() if q.requires_grad]

                    def step() -> None:
                        x.grad = None
                        for q in params:
                            q.grad = None
                        with torch.autocast(device.type, dtype=autocast or torch.bfloat16,
                                            enabled=autocast is not None):
                            y = layer(x)
                        y.backward(gy)

                    return step

                steps = {k: make(v) for k, v in variants.items()}
                res = interleaved(steps, repeats, warmup, device)
                add_ratios(res, "lora")
                for name, r in res.items():
                    r["floor_ratio"] = layer_floor_ratio(name, p)
                    r["time_over_floor"] = r["time_ratio"] / r["floor_ratio"]
                    macs = tokens * out_f * in_f * products_per_linear(name, p)
                    r["matmul_tflops"] = 2 * macs / r["time_s"] / 1e12
                key = f"{out_f}x{in_f}_t{tokens}_p{p}"
                out[key] = {"out": out_f, "in": in_f, "tokens": tokens, "dropout": p, "results": res}
                log(table(res, f"layer {out_f}x{in_f}, {tokens} tokens, dropout {p}"))
                if device.type == "cuda" and tokens == max(tokens_list):
                    out[key]["profile"] = {k: profile_kernels(steps[k]) for k in ("lora", "spp-fused")
                                           if k in steps}
                del variants, steps
        del base
        gc.collect()
    return out


def profile_steps(arch: Arch, blocks: int, batch: int, seq: int, dropouts: list[float], dtype: torch.dtype,
                  autocast: torch.dtype | None, device: torch.device) -> dict[str, Any]:
    """Kernel-time profile of one step of LoRA and SPP-fused (no checkpointing) per dropout."""
    base = cut_model(arch, blocks, dtype, device)
    ids = torch.randint(0, arch.vocab, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
    out: dict[str, Any] = {"blocks": blocks, "batch": batch, "seq": seq}
    for p in dropouts:
        variants = build_variants(base, p, ["fused"], False)
        out[f"p{p}"] = {k: profile_kernels(make_step(variants[k], {"input_ids": ids, "labels": ids}, autocast))
                        for k in ("lora", "spp-fused")}
        del variants
        gc.collect()
    return out


def table(res: dict[str, dict[str, Any]], title: str) -> str:
    """Markdown table: time and memory as ratios to LoRA, with the matmul floor beside the time ratio."""
    lines = [f"**{title}**", "", "| variant | time (ms) | x LoRA | floor | x/floor | peak (MiB) | x LoRA |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in res.items():
        lines.append(f"| {name} | {1000 * r['time_s']:.1f} | {r['time_ratio']:.3f} | {r['floor_ratio']:.3f} | "
                     f"{r['time_over_floor']:.3f} | {r['peak_mib']:.0f} | {r['mem_ratio']:.3f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    parser.add_argument("--blocks", type=int, nargs="+", default=[2, 4],
                        help="decoder-block counts measured (the two largest give the full-model extrapolation)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--checkpointing", choices=["off", "on", "both"], default="both")
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.0, 0.05])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=list(IMPLS))
    parser.add_argument("--sparse-lora", action=argparse.BooleanOptionalAction, default=True,
                        help="include SparsePEFT r=8 (adapter sparse_lora) where this checkout has it")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--precision", choices=["bf16-mixed", "bf16-true"], default="bf16-mixed",
                        help="bf16-mixed: autocast bf16 (Lightning's bf16-mixed); bf16-true: no autocast")
    parser.add_argument("--layers", choices=["on", "off", "only"], default="on",
                        help="also (or only) the single-layer measurement at 4096x4096, 11008x4096, 4096x11008")
    parser.add_argument("--layer-tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--profile-only", action="store_true",
                        help="only the kernel profile of LoRA vs SPP-fused, for every --batch (largest --blocks)")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu (development)")
    parser.add_argument("--out", default=None, help="JSON name under experiments/results/ (or a path)")
    args = parser.parse_args(argv)
    if any(b < 1 for b in args.blocks) or len(set(args.blocks)) != len(args.blocks):
        parser.error("--blocks: give distinct positive block counts, e.g. --blocks 2 4")
    if any(not 0 <= p < 1 for p in args.dropout):
        parser.error("--dropout: each value must be in [0, 1)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print(CUDA_NOTE)
        return {"skipped": CUDA_NOTE}
    device = torch.device(args.device or "cuda")
    arch = SHAPES[args.shape]
    dtype = torch.bfloat16
    autocast = torch.bfloat16 if args.precision == "bf16-mixed" else None
    ckpts = {"off": [False], "on": [True], "both": [False, True]}[args.checkpointing]
    use_sl = args.sparse_lora and sparse_lora_module() is not None
    lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    t0 = time.time()
    payload: dict[str, Any] = {
        "benchmark": "gpu_training_step", "command": "python -m benchmarks.gpu_step_bench " + " ".join(
            sys.argv[1:] if argv is None else argv), "shape": args.shape, "arch": asdict(arch),
        "seq": args.seq, "weights_dtype": str(dtype), "adapter_dtype": "torch.float32",
        "precision": args.precision, "spp_r": SPP_R, "lora_r": LORA_R, "targets": list(DEFAULT_TARGETS),
        "repeats": args.repeats, "warmup": args.warmup, "pruning": "2:4 magnitude on random weights",
        "memory": "peak_mib = max_memory_allocated during the step minus memory_allocated before it "
                  "(activations, gradients, transients; frozen weights and optimizer states are outside it)",
        "sparse_peft": ("included (spp.adapters.methods.sparse_lora.layer, r=8, alpha 16) in the model step; not in "
                        "the layer level" if use_sl else "not measured (spp.adapters.methods.sparse_lora.layer absent "
                        "or --no-sparse-lora)"),
        "env": environment(device)}
    if device.type == "cuda":
        payload["env"]["cuda"] = torch.version.cuda
    def save() -> None:  # after every part, so a run stopped by a time limit keeps what it measured
        payload["wall_s"] = time.time() - t0
        payload["tables_md"] = "\n".join(lines)
        if args.out or device.type == "cuda":
            write_json(payload, args.out or f"gpu_step_{args.shape}.json")

    if args.profile_only:
        if device.type != "cuda":
            raise SystemExit("--profile-only needs CUDA (torch.profiler CUDA kernel times)")
        payload["step_profile"] = {f"b{b}": profile_steps(arch, max(args.blocks), b, args.seq, args.dropout, dtype,
                                                           autocast, device) for b in args.batch}
        save()
        return payload
    if args.layers != "only":
        groups = {}
        for nb in sorted(args.blocks):
            groups[nb] = measure_model(arch, nb, args.batch, args.seq, ckpts, args.dropout, args.impls,
                                       args.repeats, args.warmup, dtype, autocast, device, log, use_sl)
            payload["model"] = {str(k): v for k, v in groups.items()}
            save()
        if len(groups) >= 2:
            payload["full_model_extrapolated"] = extrapolate(groups, arch, dtype)
            for key, rows in payload["full_model_extrapolated"].items():
                if isinstance(rows, dict) and "lora" in rows:
                    log(f"extrapolated to {arch.layers} blocks, {key}: " + ", ".join(
                        f"{n} time x{r['time_ratio']:.3f} (floor {r['floor_ratio']:.3f}) total mem "
                        f"x{r['total_mem_ratio']:.3f} ({r['total_peak_mib'] / 1024:.1f} GiB)"
                        for n, r in rows.items()))
        payload["full_model_floor"] = {
            f"b{b}_ckpt{int(c)}_p{p}": {n: floor_ratio(arch, arch.layers, b, args.seq, n, p, c)
                                        for n in variant_names(args.impls, use_sl)}
            for b in args.batch for c in ckpts for p in args.dropout}
        if args.profile and device.type == "cuda":
            payload["step_profile"] = profile_steps(arch, max(args.blocks), min(args.batch), args.seq,
                                                    args.dropout, dtype, autocast, device)
        save()
    if args.layers != "off" and args.shape != "tiny":
        shapes = list(LAYER_SHAPES) if args.shape == "7b" else [(arch.hidden, arch.hidden), (arch.ffn, arch.hidden),
                                                                 (arch.hidden, arch.ffn)]
        payload["layers"] = measure_layers(shapes, args.layer_tokens, args.dropout, args.impls, args.repeats,
                                           args.warmup, dtype, autocast, device, log)
    save()
    if args.out or device.type == "cuda":
        print(f"wrote {args.out or f'gpu_step_{args.shape}.json'}")
    return payload


if __name__ == "__main__":
    main()
