"""The whole harness in one command: ``nice -n 10 python -m benchmarks`` (layer, model step, 2:4 inference).

Each part writes its JSON under ``experiments/results/`` (``layer_bench_<dev>.json``, ``model_bench_<dev>.json``,
``sparse24_<dev>.json``). Pass ``--quick`` for a short smoke run (fewer repeats, one shape, one dropout).
"""

from __future__ import annotations

import argparse

from benchmarks import layer_bench, model_bench, sparse24_bench


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run; results go to *_quick.json")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile in the model step")
    args = parser.parse_args(argv)
    if args.quick:
        layer_bench.main(["--shapes", "1024x1024", "--repeats", "2", "--dropout", "0.05",
                          "--out", "layer_bench_quick.json"])
        model_bench.main(["--repeats", "2", "--dropout", "0.05", "--batch", "1", "--seq", "64",
                          "--out", "model_bench_quick.json"])
    else:
        layer_bench.main([])
        model_bench.main(["--compile"] if args.compile else [])
    sparse24_bench.main([])


if __name__ == "__main__":
    main()
