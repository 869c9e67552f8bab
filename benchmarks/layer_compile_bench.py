"""``torch.compile`` of SPP's elementwise helper alone (not the model): compile time and per-call cost.

Run from the repository root: ``python -m benchmarks.layer_compile_bench`` (1 thread, about 1 min). For the
SmolLM2-135M projection shapes (out x in) it compiles ``_blocked_scale`` (the one elementwise pass that builds
``W'`` / ``W_eff`` from ``W``, alpha and beta; the fused forward and backward each call it once per layer), checks
the compiled result against eager, then times both interleaved (process CPU time, median of 30). Writes
``experiments/results/layer_compile_bench_cpu.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch

from lab.bench.common import cpu_seconds, environment, write_json
from spp.adapters.methods.spp.functional import _blocked_scale

SMOLLM2_SHAPES = ((1536, 576), (576, 1536), (576, 576), (192, 576))  # gate/up, down, q/o, k/v


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default="layer_compile_bench_cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for m, n in SMOLLM2_SHAPES:
        gen = torch.Generator().manual_seed(0)
        w, a, b = torch.randn(m, n, generator=gen), torch.randn(16, n, generator=gen), torch.randn(m, 1, generator=gen)
        compiled = torch.compile(_blocked_scale, dynamic=False)
        c0, t0 = cpu_seconds(), time.perf_counter()
        got = compiled(w, a, b, 2.0, False)
        compile_wall, compile_cpu = time.perf_counter() - t0, cpu_seconds() - c0
        torch.testing.assert_close(got, _blocked_scale(w, a, b, 2.0, False))
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        for _ in range(args.repeats):
            for name, fn in (("eager", _blocked_scale), ("compiled", compiled)):
                c0 = cpu_seconds()
                fn(w, a, b, 2.0, False)
                times[name].append(cpu_seconds() - c0)
        results[f"{m}x{n}"] = {"compile_wall_s": compile_wall, "compile_cpu_s_main_process": compile_cpu,
                               "eager_ms": 1e3 * statistics.median(times["eager"]),
                               "compiled_ms": 1e3 * statistics.median(times["compiled"]),
                               "load_avg_1m": os.getloadavg()[0]}
        print(f"{m}x{n}: {results[f'{m}x{n}']}", flush=True)
    payload = {"benchmark": "layer_compile", "function": "spp.adapters.methods.spp.functional._blocked_scale",
               "threads": 1, "results": results, "env": environment(torch.device("cpu"))}
    path = write_json(payload, args.out)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
