"""2:4 inference of the merged SPP model on a GPU: semi-structured sparse vs dense, bf16.

Run (CUDA): ``python -m benchmarks.gpu_sparse24`` (LLaMA-7B shape, random weights, 2:4 magnitude-pruned, SPP
r=16 injected with random alpha/beta and merged with ``spp.merge_and_unload``, so the weights are what an
exported SPP model holds). Two parts:

1. per linear layer (4096x4096, 11008x4096, 4096x11008): ``F.linear`` with the dense merged weight vs the same
   weight converted by ``torch.sparse.to_sparse_semi_structured`` with cuSPARSELt (PyTorch's default backend)
   and with CUTLASS, for decode-sized (1-16 tokens) and prefill-sized (2048, 8192 tokens) inputs;
2. end to end on the model with ``--blocks`` decoder blocks (default all 32):
   ``spp.export.semi_structured.export_semi_structured`` converts every adapted projection; prefill (2048 tokens, batch
   1 and 4, forward with the last position's logits) and greedy decode (``generate``, batch 1, 32 new tokens) tokens/s
   against the dense merged model, the GPU kernel time of each (``torch.profiler``), the max abs difference of the
   logits (and of each against the same weights in fp32), and how many greedy tokens agree. ``--contiguous`` first wraps
   the converted layers so that they take 2-D inputs and return contiguous outputs (see ``flatten_inputs``).

Per-call wall time and kernel time are both reported: in PyTorch 2.11 every cuSPARSELt product rebuilds its
descriptors and plan on the host (about 0.5-1 ms; pytorch/pytorch#153825, plan caching in later releases), so
the kernel time is what the 2:4 hardware gives and the wall time is what this PyTorch gives.

torchao's ``sparsify_`` is used when torchao is importable (it is not on the lent machines' image; the JSON
says so). Times are medians of CUDA-event timings after warm-up. Writes ``experiments/results/gpu_sparse24.json``.
Without CUDA it prints why it skips and exits: PyTorch has no 2:4 kernels on the CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.gpu_step_bench import SHAPES, cut_model, profile_kernels, share_copy
from benchmarks.layer_bench import pruned_base
from lab.bench.common import cuda_time, environment, write_json
from spp.adapters.methods.spp.layer import SPPLinear
from spp.adapters.methods.spp.model import inject, merge_and_unload, spp_layers
from spp.export.semi_structured import count_2_4_violations, export_semi_structured

CUDA_NOTE = ("skipped: no CUDA device. PyTorch's 2:4 semi-structured kernels (cuSPARSELt / CUTLASS) exist only "
             "on CUDA GPUs (sm80+); on the CPU a 2:4 model runs as a dense model and there is no speed-up.")
LAYER_SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008))


def merged_weight(out_f: int, in_f: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """A 2:4 weight as SPP leaves it: magnitude 2:4, SPP r=16 with random alpha/beta, merged (bf16)."""
    layer = SPPLinear(pruned_base(out_f, in_f, torch.bfloat16, device, seed), r=16, beta_init="kaiming")
    layer.merge(keep_original=False)
    return layer.base.weight.detach()


def to_semi_structured(w: torch.Tensor, backend: str) -> torch.Tensor:
    """``w`` as a semi-structured sparse tensor with ``backend`` = cusparselt or cutlass."""
    from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured

    old = SparseSemiStructuredTensor._FORCE_CUTLASS
    SparseSemiStructuredTensor._FORCE_CUTLASS = backend == "cutlass"
    try:
        return to_sparse_semi_structured(w)
    finally:
        SparseSemiStructuredTensor._FORCE_CUTLASS = old


@torch.no_grad()
def layer_speedups(tokens_list: list[int], backends: list[str], repeats: int,
                   device: torch.device, log: Any) -> dict[str, Any]:
    """Dense vs 2:4 ``F.linear`` per shape, token count and backend; relative error of the sparse output."""
    out: dict[str, Any] = {}
    for out_f, in_f in LAYER_SHAPES:
        w = merged_weight(out_f, in_f, device)
        assert count_2_4_violations(w) == 0
        sparse = {}
        for b in backends:
            try:
                ws = to_semi_structured(w, b)
                F.linear(torch.ones(16, in_f, device=device, dtype=w.dtype), ws)  # some kernels fail only here
                sparse[b] = ws
            except (RuntimeError, NotImplementedError) as err:  # backend missing for this GPU or build
                out.setdefault("backend_errors", {})[b] = str(err).splitlines()[0][:300]
                log(f"{b}: not usable here: {out['backend_errors'][b]}")
        for tokens in tokens_list:
            gen = torch.Generator(device=device).manual_seed(tokens)
            x = torch.randn(tokens, in_f, generator=gen, device=device, dtype=torch.bfloat16)
            ref = F.linear(x, w)
            row: dict[str, Any] = {"out": out_f, "in": in_f, "tokens": tokens,
                                   "dense_ms": cuda_time(lambda x=x, w=w: F.linear(x, w), repeats)}
            row["dense_kernel_ms"] = profile_kernels(lambda x=x, w=w: F.linear(x, w), repeats)["total_ms"]
            for b, ws in sparse.items():
                y = F.linear(x, ws)
                rel = float((y.float() - ref.float()).norm() / ref.float().norm())
                ms = cuda_time(lambda x=x, ws=ws: F.linear(x, ws), repeats)
                kms = profile_kernels(lambda x=x, ws=ws: F.linear(x, ws), repeats)["total_ms"]
                row[b] = {"ms": ms, "speedup": row["dense_ms"] / ms, "rel_err": rel, "kernel_ms": kms,
                          "kernel_speedup": row["dense_kernel_ms"] / kms}
            key = f"{out_f}x{in_f}_t{tokens}"
            out[key] = row
            log(f"linear {key}: dense {row['dense_ms']:.4f} ms (kernels {row['dense_kernel_ms']:.4f}); " + "; ".join(
                f"{b} {row[b]['ms']:.4f} ms x{row[b]['speedup']:.2f}, kernels {row[b]['kernel_ms']:.4f} ms "
                f"x{row[b]['kernel_speedup']:.2f} (rel err {row[b]['rel_err']:.1e})" for b in sparse))
    return out


def _flat_linear(mod: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = F.linear(x.reshape(-1, x.shape[-1]), mod.weight, mod.bias)
    return y.contiguous().view(*x.shape[:-1], mod.out_features)


def flatten_inputs(model: nn.Module, names: list[str]) -> None:
    """Feed the converted linears 2-D inputs and return contiguous outputs. PyTorch's semi-structured tensor has
    no ``expand`` (the batched ``matmul`` path of a 3-D input whose leading dimensions cannot be folded, as in
    batched decode), and its cuSPARSELt product returns a transposed view: q/k/v built from it are not contiguous
    in the head dimension, so SDPA leaves its flash kernels for the math fallback (fp32)."""
    for name in names:
        mod = model.get_submodule(name)
        mod.forward = _flat_linear.__get__(mod)


def merged_model(blocks: int, device: torch.device) -> nn.Module:
    """The LLaMA-7B-shape model cut to ``blocks`` blocks: 2:4, SPP injected with random alpha/beta, merged."""
    model = cut_model(SHAPES["7b"], blocks, torch.bfloat16, device)
    inject(model, r=16)
    with torch.no_grad():
        for layer in spp_layers(model).values():
            layer.spp_beta.normal_(std=0.05)
    merge_and_unload(model)
    model.config.pad_token_id = model.config.eos_token_id
    return model.eval()


@torch.no_grad()
def end_to_end(blocks: int, prefill_batches: list[int], seq: int, decode_batches: list[int], new_tokens: int,
               prompt: int, repeats: int, device: torch.device, log: Any, out: dict[str, Any],
               save: Any = None, contiguous: bool = False) -> dict[str, Any]:
    """Prefill and greedy-decode throughput of the merged model, dense vs exported 2:4 (cuSPARSELt), into
    ``out`` (``save()`` is called after each part, so a run stopped by a time limit keeps what it measured)."""
    save = save or (lambda: None)
    dense = merged_model(blocks, device)
    sparse = share_copy(dense)  # embeddings, norms and LM head shared; projections replaced below
    t0 = time.perf_counter()
    converted = export_semi_structured(sparse)
    if contiguous:
        flatten_inputs(sparse, converted)
    torch.cuda.synchronize()
    convert_s = time.perf_counter() - t0
    vocab = dense.config.vocab_size
    gen = torch.Generator(device=device).manual_seed(0)
    out.update({"blocks": blocks, "converted_layers": len(converted), "convert_s": convert_s,
                "memory_gib_after_export": torch.cuda.memory_allocated(device) / 2**30, "prefill": {}, "decode": {},
                "contiguous_outputs_wrapper": contiguous})
    for b in prefill_batches:
        x = torch.randint(0, vocab, (b, seq), generator=gen, device=device)
        td = cuda_time(lambda x=x: dense(x, use_cache=False, logits_to_keep=1), repeats)
        ts = cuda_time(lambda x=x: sparse(x, use_cache=False, logits_to_keep=1), repeats)
        kd = profile_kernels(lambda x=x: dense(x, use_cache=False, logits_to_keep=1), 2)
        ks = profile_kernels(lambda x=x: sparse(x, use_cache=False, logits_to_keep=1), 2)
        out["prefill"][f"b{b}"] = {"batch": b, "tokens": b * seq, "dense_ms": td, "sparse_ms": ts,
                                   "dense_tokens_per_s": b * seq / td * 1e3, "sparse_tokens_per_s": b * seq / ts * 1e3,
                                   "speedup": td / ts, "dense_kernel_ms": kd["total_ms"],
                                   "sparse_kernel_ms": ks["total_ms"],
                                   "kernel_speedup": kd["total_ms"] / ks["total_ms"],
                                   "dense_gemm_kernel_ms": kd["ms_per_step"]["gemm"],
                                   "sparse_top_kernels": ks["top_kernels"][:6]}
        log(f"prefill batch {b} x {seq}: dense {td:.1f} ms, 2:4 {ts:.1f} ms, x{td / ts:.3f}; GPU kernel time dense "
            f"{kd['total_ms']:.1f} ms, 2:4 {ks['total_ms']:.1f} ms, x{kd['total_ms'] / ks['total_ms']:.3f}")
        for k in ks["top_kernels"][:6]:
            log(f"    2:4 prefill kernel {k['ms_per_step']:.2f} ms  {k['name'][:100]}")
        save()
    flatten_inputs(sparse, converted)
    for b in decode_batches:
        x = torch.randint(0, vocab, (b, prompt), generator=gen, device=device)

        def run(m: nn.Module, x: torch.Tensor = x) -> torch.Tensor:
            return m.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)

        try:
            agree = float((run(dense)[:, prompt:] == run(sparse)[:, prompt:]).float().mean())
            td = cuda_time(lambda: run(dense), max(2, repeats // 6), warmup=1)
            ts = cuda_time(lambda: run(sparse), max(2, repeats // 6), warmup=1)
        except (RuntimeError, NotImplementedError) as err:
            out["decode"][f"b{b}"] = {"batch": b, "error": str(err).splitlines()[0][:300]}
            log(f"greedy decode batch {b}: failed: {out['decode'][f'b{b}']['error']}")
            continue
        n = b * new_tokens
        out["decode"][f"b{b}"] = {"batch": b, "prompt": prompt, "new_tokens": new_tokens, "dense_ms": td,
                                  "sparse_ms": ts, "dense_tokens_per_s": n / td * 1e3,
                                  "sparse_tokens_per_s": n / ts * 1e3, "speedup": td / ts,
                                  "greedy_token_agreement": agree}
        log(f"greedy decode batch {b}, {new_tokens} new tokens: dense {n / td * 1e3:.0f} tok/s, 2:4 "
            f"{n / ts * 1e3:.0f} tok/s, x{td / ts:.3f}, token agreement {agree:.3f}")
        save()
    ids = torch.randint(0, vocab, (1, seq), generator=gen, device=device)
    ld = dense(ids, use_cache=False).logits.float()
    ls = sparse(ids, use_cache=False).logits.float()
    sparse = None  # free the 2:4 copy before the fp32 reference
    torch.cuda.empty_cache()
    ref = dense.float()(ids, use_cache=False).logits  # the same merged weights in fp32: rounding reference
    out["logits"] = {"tokens": seq, "max_abs_diff": float((ld - ls).abs().max()),
                     "max_abs_logit": float(ld.abs().max()), "mean_abs_diff": float((ld - ls).abs().mean()),
                     "argmax_agreement": float((ld.argmax(-1) == ls.argmax(-1)).float().mean()),
                     "dense_bf16_vs_fp32_max_abs_diff": float((ld - ref).abs().max()),
                     "sparse_bf16_vs_fp32_max_abs_diff": float((ls - ref).abs().max()),
                     "dense_bf16_vs_fp32_argmax_agreement": float((ld.argmax(-1) == ref.argmax(-1)).float().mean())}
    del ld, ls, ref
    lg = out["logits"]
    log(f"logits over {seq} tokens: max |dense - 2:4| = {lg['max_abs_diff']:.4f} (max |logit| "
        f"{lg['max_abs_logit']:.2f}); vs the fp32 model: dense bf16 {lg['dense_bf16_vs_fp32_max_abs_diff']:.4f}, "
        f"2:4 bf16 {lg['sparse_bf16_vs_fp32_max_abs_diff']:.4f}; argmax agreement dense/2:4 "
        f"{lg['argmax_agreement']:.4f}, dense bf16/fp32 {lg['dense_bf16_vs_fp32_argmax_agreement']:.4f}")
    return out


@torch.no_grad()
def torchao_prefill(blocks: int, seq: int, repeats: int, device: torch.device) -> dict[str, Any]:
    """torchao's ``sparsify_`` with its semi-sparse weight config, prefill only (when torchao is present)."""
    from torchao.sparsity import semi_sparse_weight, sparsify_

    dense = merged_model(blocks, device)
    ids = torch.randint(0, dense.config.vocab_size, (1, seq), device=device)
    td = cuda_time(lambda: dense(ids, use_cache=False, logits_to_keep=1), repeats)
    sparsify_(dense, semi_sparse_weight(), lambda m, fqn: isinstance(m, nn.Linear) and "lm_head" not in fqn)
    ts = cuda_time(lambda: dense(ids, use_cache=False, logits_to_keep=1), repeats)
    return {"dense_ms": td, "sparse_ms": ts, "speedup": td / ts}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer-tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 2048, 8192])
    parser.add_argument("--backends", nargs="+", default=["cusparselt", "cutlass"], choices=["cusparselt", "cutlass"])
    parser.add_argument("--blocks", type=int, default=32, help="decoder blocks of the end-to-end model (7B: 32)")
    parser.add_argument("--seq", type=int, default=2048, help="prefill length")
    parser.add_argument("--prefill-batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--decode-batch", type=int, nargs="*", default=[1], help="none: no decode measurement")
    parser.add_argument("--contiguous", action="store_true",
                        help="wrap the converted linears (2-D input, contiguous output) before the prefill too")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--parts", nargs="+", default=["layers", "model"], choices=["layers", "model"])
    parser.add_argument("--out", default=None, help="JSON name under experiments/results/ (or a path)")
    args = parser.parse_args(argv)
    if args.blocks < 1 or args.seq < 1 or args.new_tokens < 1:
        parser.error("--blocks, --seq and --new-tokens must be positive")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(CUDA_NOTE)
        return {"skipped": CUDA_NOTE}
    device = torch.device("cuda")
    lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    t0 = time.time()
    has_torchao = importlib.util.find_spec("torchao") is not None
    payload: dict[str, Any] = {
        "benchmark": "gpu_sparse24", "command": "python -m benchmarks.gpu_sparse24 " + " ".join(
            sys.argv[1:] if argv is None else argv), "dtype": "torch.bfloat16", "env": environment(device),
        "weights": "random LLaMA-7B shape, 2:4 magnitude, SPP r=16 random alpha/beta merged",
        "cusparselt_available": bool(torch.backends.cusparselt.is_available()),
        "cusparselt_version": torch.backends.cusparselt.version() if torch.backends.cusparselt.is_available()
        else None, "torchao": "present" if has_torchao else "not installed on this machine (not measured)"}
    payload["env"]["cuda"] = torch.version.cuda
    def save() -> None:
        payload["wall_s"] = time.time() - t0
        payload["log"] = "\n".join(lines)
        write_json(payload, args.out or "gpu_sparse24.json")

    if "layers" in args.parts:
        payload["layers"] = layer_speedups(args.layer_tokens, args.backends, args.repeats, device, log)
        save()
    if "model" in args.parts:
        payload["end_to_end"] = {}
        end_to_end(args.blocks, args.prefill_batch, args.seq, args.decode_batch, args.new_tokens, args.prompt,
                   args.repeats, device, log, payload["end_to_end"], save, args.contiguous)
        torch.cuda.empty_cache()
        if has_torchao:
            try:
                payload["torchao_prefill"] = torchao_prefill(args.blocks, args.seq, args.repeats, device)
            except Exception as err:  # noqa: BLE001 - report any torchao failure instead of losing the run
                payload["torchao_prefill"] = {"error": repr(err)[:500]}
    save()
    print(f"wrote {args.out or 'gpu_sparse24.json'}")
    return payload


if __name__ == "__main__":
    main()
