"""The pruning plan of the paper's LLaMA sizes on 1 and 8 x 80 GB GPUs (issue 29): host RAM per node, GPU memory
per device, estimated time. Computed from ``conf/model/*.yaml`` on the ``meta`` device; nothing is loaded.

    python benchmarks/pruning_plan.py            # prints the table, writes docs/results/pruning_plan.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from spp.planning.pruning import GIB, plan
from spp.planning.shapes import shape_from_arch
from spp.projections import DEFAULT_TARGETS

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("llama7b", "llama13b", "llama30b", "llama65b", "llama2_70b")


def main() -> None:
    rows = []
    for name in MODELS:
        arch = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml").arch)
        shape = shape_from_arch(name, arch, list(DEFAULT_TARGETS))
        for pruner in ("wanda", "sparsegpt"):
            rows += [plan(shape, world, pruner) for world in (1, 8)]
    out = ROOT / "docs" / "results" / "pruning_plan.json"
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print("| model | params | pruner | GPUs | host RAM, rank-0 node (GiB) | GPU memory per device (GiB) | est. time |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['params'] / 1e9:.1f} B | {r['pruner']} | {r['world']} | "
              f"{r['host_bytes']['rank0_node'] / GIB:.0f} (weights {r['host_bytes']['weights'] / GIB:.0f}) | "
              f"{r['gpu_bytes_per_device'] / GIB:.1f} | {r['seconds']['total'] / 60:.1f} min |")
    print(f"written: {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
