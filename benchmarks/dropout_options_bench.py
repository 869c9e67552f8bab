"""Two exact rearrangements of SPP's dropout backward that would remove a full-size product, timed.

Run from the repository root: ``python -m benchmarks.dropout_options_bench`` (1 thread, about 2 min). With dropout
SPP's fused backward does three full-size products per layer besides the forward's two: ``g W`` (base input
gradient), ``g W'`` (adapter input gradient) and ``G = g^T xd`` (whose block reductions with ``W`` give d alpha and
d beta). At the SmolLM2-135M shapes and N = 1024 tokens (the main job's 8 x 128) this times, process CPU time,
median of ``--repeats`` interleaved:

* ``current``: what ``SPPFusedFunction.backward`` does for the adapter: build ``W'``, ``g W'``, ``G``, ``G ⊙ W``,
  two bmm reductions (``d beta`` and ``d alpha``);
* ``block_v``: one product per row block ``V_j = (g_j ⊙ beta_j) W_j`` (m/r rows each, together one full product),
  then ``dxd = s Σ_j alpha_j ⊙ V_j`` and ``d alpha_j = s Σ_t xd ⊙ V_j`` (exact; ``d beta`` would then need the
  forward's adapter output, N x m per layer, kept alive: not counted here);
* ``sparse_dropout``: ``xd W'^T = (x W'^T - (x ⊙ dropped) W'^T) / (1 - p)``; the 5 % dropped entries as an
  ``embedding_bag`` over the rows of ``W'^T`` (forward and its backward: the corrections to ``g W'`` and ``G``),
  to be set against one dense product per correction;
* ``one product``: a single ``g W`` for scale.

Writes ``experiments/results/dropout_options_bench_cpu.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lab.bench.common import cpu_seconds, environment, write_json

SMOLLM2_SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536))  # (out, in): q/o, k/v, gate/up, down


def variants(m: int, n: int, tokens: int, r: int, p: float) -> dict[str, Callable[[], Any]]:
    """The timed closures for one layer shape."""
    gen = torch.Generator().manual_seed(0)
    k = m // r
    w = torch.randn(m, n, generator=gen)
    alpha, beta = torch.randn(r, n, generator=gen), torch.randn(m, 1, generator=gen)
    g, x = torch.randn(tokens, m, generator=gen), torch.randn(tokens, n, generator=gen)
    dropped = torch.rand(tokens, n, generator=gen) < p
    xd = x.masked_fill(dropped, 0.0) / (1 - p)

    def current() -> Any:
        w_ad = (beta.view(r, k, 1) * alpha.view(r, 1, n)).view(m, n).mul_(w)
        dxd = g @ w_ad
        prod = (g.t() @ xd).mul_(w).view(r, k, n)
        return dxd, torch.bmm(prod, alpha.unsqueeze(-1)), torch.bmm(beta.view(r, 1, k), prod)

    def block_v() -> Any:
        gb = g * beta.view(1, m)
        dxd = torch.zeros(tokens, n)
        ga = torch.empty(r, n)
        for j in range(r):
            v = gb[:, j * k:(j + 1) * k] @ w[j * k:(j + 1) * k]
            dxd.addcmul_(v, alpha[j])
            ga[j] = v.mul_(xd).sum(0)
        return dxd, ga

    def sparse_dropout() -> Any:
        idx = dropped.nonzero()
        offsets = torch.searchsorted(idx[:, 0].contiguous(), torch.arange(tokens))
        w_t = (beta.view(r, k, 1) * alpha.view(r, 1, n)).view(m, n).mul_(w).t().contiguous().requires_grad_(True)
        vals = x[dropped].requires_grad_(True)
        out = F.embedding_bag(idx[:, 1].contiguous(), w_t, offsets, mode="sum", per_sample_weights=vals)
        out.backward(g)
        return out

    def one_product() -> Any:
        return g @ w

    return {"current": current, "block_v": block_v, "sparse_dropout": sparse_dropout, "one product": one_product}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--r", type=int, default=16)
    parser.add_argument("--p", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="dropout_options_bench_cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for m, n in SMOLLM2_SHAPES:
        fns = variants(m, n, args.tokens, args.r, args.p)
        times: dict[str, list[float]] = {k: [] for k in fns}
        for rnd in range(args.repeats + 1):
            for name, fn in fns.items():
                c0 = cpu_seconds()
                fn()
                if rnd:
                    times[name].append(cpu_seconds() - c0)
        ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        results[f"{m}x{n}"] = {"cpu_ms": ms, "in_products": {k: v / ms["one product"] for k, v in ms.items()},
                               "load_avg_1m": os.getloadavg()[0]}
        print(f"{m}x{n}: " + ", ".join(f"{k} {v:.1f} ms ({v / ms['one product']:.2f} products)"
                                       for k, v in ms.items()), flush=True)
    payload = {"benchmark": "dropout_options", "tokens": args.tokens, "r": args.r, "p": args.p, "threads": 1,
               "time": "process CPU ms per call, median", "results": results,
               "env": environment(torch.device("cpu"))}
    path = write_json(payload, args.out)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
