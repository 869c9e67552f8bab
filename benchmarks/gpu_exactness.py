"""Exactness of the SPP pipeline under CUDA mixed precision: zeros kept bit-exactly.

Run (CUDA): ``python -m benchmarks.gpu_exactness`` (a few seconds). No Hydra: a tiny random LLaMA is pruned
2:4 by magnitude, SPP (r=16, fp32 alpha/beta) is injected and fitted a few AdamW steps under ``torch.autocast``,
merged (``spp.merge_and_unload``), exported with ``save_pretrained`` (safetensors) and reloaded. For each case
(bf16 weights + autocast bf16 as the GPU config ``llama7b`` + ``bf16-mixed``; fp32 weights + autocast bf16;
fp16 weights + autocast fp16 with a GradScaler) it asserts:

- the frozen weights do not change while training (bit-exact);
- every pruned zero is still exactly zero after the merge, the export and the reload, and no kept weight
  became zero; the 2:4 pattern holds;
- the merged weights equal the CPU formula ``W ⊙ (1 + s·Repeat0(alpha) ⊙ beta)`` (Eq. 5-6, computed in float64
  on the CPU from the trained alpha/beta) within one unit ``|ref|·eps`` of the bf16/fp16 weight dtype (two for
  fp32 weights: the fp32 factor and the product are each rounded once);
- the reloaded model's tensors are bit-identical to the merged model's, and so are its logits;
- the loss falls.

Writes ``experiments/results/gpu_exactness.json``. Without CUDA it says so and exits (``--device cpu`` runs the
same checks on the CPU for development, autocast bf16 only).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any

import torch
from torch import nn

from benchmarks.gpu_step_bench import magnitude_2_4_
from lab.bench.common import environment, write_json
from spp.adapters.methods.spp.functional import repeat_alpha
from spp.adapters.methods.spp.model import inject, merge_and_unload, spp_layers
from spp.export.semi_structured import count_2_4_violations
from spp.models.tiny import tiny_llama
from spp.projections import DEFAULT_TARGETS

CUDA_NOTE = ("skipped: no CUDA device. This check runs the prune -> SPP fit (autocast) -> merge -> export "
             "pipeline on a GPU; pass --device cpu to run it on the CPU instead.")
# (name, weight dtype, autocast dtype)
CASES: dict[str, tuple[torch.dtype, torch.dtype]] = {
    "bf16_weights_autocast_bf16": (torch.bfloat16, torch.bfloat16),
    "fp32_weights_autocast_bf16": (torch.float32, torch.bfloat16),
    "fp16_weights_autocast_fp16": (torch.float16, torch.float16),
}
TINY = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2}


def target_linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in DEFAULT_TARGETS}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit pattern of a floating tensor as integers of the same width."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def ulp_bound(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``dtype`` at each |ref| (the spacing of ``dtype`` numbers there)."""
    eps = torch.finfo(dtype).eps
    tiny = torch.finfo(dtype).tiny
    return torch.clamp(ref.abs(), min=tiny) * eps


def cpu_formula(weight: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, scale: float) -> torch.Tensor:
    """Merged weight by the paper's formula in float64 on the CPU: ``W ⊙ (1 + s Repeat0(alpha) ⊙ beta)``."""
    w = weight.detach().double().cpu()
    a = repeat_alpha(alpha.detach().double().cpu(), w.shape[0])
    return w * (1 + scale * a * beta.detach().double().cpu())


def run_case(name: str, wdtype: torch.dtype, adtype: torch.dtype, device: torch.device, steps: int,
             lr: float, seed: int = 0) -> dict[str, Any]:
    """The whole pipeline for one precision case; returns the measured figures and the check results."""
    model = tiny_llama(seed=seed, **TINY)
    rope = {n: b.clone() for n, b in model.named_buffers()}  # fp32, as from_pretrained keeps them
    model.to(device=device, dtype=wdtype)
    for n, b in rope.items():
        model.get_buffer(n).data = b.to(device)
    magnitude_2_4_(model)
    pruned = {n: m.weight.detach().clone() for n, m in target_linears(model).items()}
    inject(model, r=16, scale=2.0, dropout=0.05, impl="fused")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    assert params and all(p.dtype == torch.float32 for p in params), "SPP alpha/beta should be fp32"
    opt = torch.optim.AdamW(params, lr=lr)
    scaler = torch.amp.GradScaler(device.type, enabled=adtype == torch.float16)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, model.config.vocab_size, (4, 64), generator=gen).to(device)
    losses = []
    for _ in range(steps):
        with torch.autocast(device.type, dtype=adtype):
            loss = model(input_ids=ids, labels=ids).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    layers = spp_layers(model)
    frozen_changed = sum(int(not torch.equal(layer.base.weight, pruned[n])) for n, layer in layers.items())
    refs = {n: cpu_formula(layer.base.weight, layer.spp_alpha, layer.spp_beta, layer.scale)
            for n, layer in layers.items()}
    beta_abs = max(float(layer.spp_beta.detach().abs().max()) for layer in layers.values())
    merge_and_unload(model)
    model.eval()
    merged = {n: m.weight.detach().clone() for n, m in target_linears(model).items()}
    zeros_lost = zeros_gained = violations = 0
    max_ulps = 0.0
    max_rel = 0.0
    for n, w in merged.items():
        was_zero = pruned[n] == 0
        zeros_gained += int((w[~was_zero] == 0).sum())
        violations += count_2_4_violations(w)
        ref = refs[n]
        diff = (w.double().cpu() - ref).abs()
        kept = ~was_zero.cpu()
        max_ulps = max(max_ulps, float((diff[kept] / ulp_bound(ref[kept], wdtype)).max()))
        max_rel = max(max_rel, float((diff[kept] / ref[kept].abs().clamp_min(1e-30)).max()))
        zeros_lost += int((bits(w)[was_zero] != bits(pruned[n])[was_zero]).sum())  # +0 stays +0, -0 stays -0
    probe = torch.randint(4, model.config.vocab_size, (2, 32), generator=gen).to(device)
    with torch.no_grad():
        logits = model(input_ids=probe).logits
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        from transformers import AutoModelForCausalLM

        reloaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=wdtype).to(device).eval()
    rsd, msd = reloaded.state_dict(), model.state_dict()
    reload_mismatch = sorted(k for k in msd if not torch.equal(msd[k], rsd[k]))
    with torch.no_grad():
        logits_re = reloaded(input_ids=probe).logits
    reload_zeros_lost = sum(int((m.weight[pruned[n] == 0] != 0).sum()) for n, m in target_linears(reloaded).items())
    n_zero = sum(int((w == 0).sum()) for w in pruned.values())
    n_all = sum(w.numel() for w in pruned.values())
    res = {
        "weights_dtype": str(wdtype), "autocast_dtype": str(adtype), "steps": steps, "lr": lr,
        "grad_scaler": adtype == torch.float16, "losses": losses, "loss_fell": losses[-1] < losses[0],
        "adapted_layers": len(layers), "pruned_zeros": n_zero, "weights": n_all, "max_abs_beta": beta_abs,
        "frozen_weights_changed_layers": frozen_changed, "zeros_lost_after_merge": zeros_lost,
        "kept_weights_turned_zero": zeros_gained, "violations_2_4": violations,
        "max_err_ulps_vs_cpu_formula": max_ulps, "max_rel_err_vs_cpu_formula": max_rel,
        "reload_mismatched_tensors": reload_mismatch, "zeros_lost_after_reload": reload_zeros_lost,
        "reload_logits_max_abs_diff": float((logits.float() - logits_re.float()).abs().max()),
    }
    res["checks"] = {
        "frozen weights unchanged while training": frozen_changed == 0,
        "every pruned zero bit-identical after merge": zeros_lost == 0,
        "no kept weight became zero": zeros_gained == 0,
        "2:4 pattern holds": violations == 0,
        "merged = CPU formula within rounding": max_ulps <= (2.0 if wdtype == torch.float32 else 1.0),
        "adapters trained (beta moved off 0)": beta_abs > 0,
        "reload bit-identical": not reload_mismatch and reload_zeros_lost == 0,
        "reload logits identical": res["reload_logits_max_abs_diff"] == 0.0,
        "loss fell": res["loss_fell"],
    }
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--out", default=None, help="JSON name under experiments/results/ (or a path)")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the loss has to be seen falling)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print(CUDA_NOTE)
        return {"skipped": CUDA_NOTE}
    device = torch.device(args.device or "cuda")
    cases = [c for c in args.cases if device.type == "cuda" or CASES[c][1] == torch.bfloat16]
    t0 = time.time()
    payload: dict[str, Any] = {
        "benchmark": "gpu_exactness", "command": "python -m benchmarks.gpu_exactness " + " ".join(
            sys.argv[1:] if argv is None else argv), "model": {"tiny_llama": TINY}, "pruning": "2:4 magnitude",
        "adapter": "SPP r=16, scale 2, dropout 0.05, fused, fp32 alpha/beta", "env": environment(device),
        "cases": {}}
    ok = True
    for name in cases:
        wdt, adt = CASES[name]
        res = run_case(name, wdt, adt, device, args.steps, args.lr)
        payload["cases"][name] = res
        passed = all(res["checks"].values())
        ok &= passed
        print(f"{name}: {'PASS' if passed else 'FAIL'}  loss {res['losses'][0]:.4f} -> {res['losses'][-1]:.4f}, "
              f"max |merged - CPU formula| = {res['max_err_ulps_vs_cpu_formula']:.3f} ulp, "
              f"zeros lost {res['zeros_lost_after_merge']}/{res['pruned_zeros']}, reload mismatches "
              f"{len(res['reload_mismatched_tensors'])}")
        for check, val in res["checks"].items():
            if not val:
                print(f"  FAILED: {check}")
    payload["all_passed"] = ok
    payload["wall_s"] = time.time() - t0
    if args.out or device.type == "cuda":
        print(f"wrote {write_json(payload, args.out or 'gpu_exactness.json')}")
    if not ok:
        raise SystemExit(1)
    return payload


if __name__ == "__main__":
    main()
