"""The pruning plan of the paper's LLaMA sizes on 1 and 8 x 80 GB GPUs: host RAM per node, GPU memory
per device, estimated time. Computed from ``conf/model/*.yaml`` on the ``meta`` device; nothing is loaded.

    python benchmarks/pruning_plan.py   # writes docs/results/pruning_plan.json and the table in docs/pruning.md

``tests/test_pruning_plan.py`` regenerates both and compares them with the committed files.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lab.bench.common import replace_between, write_committed
from spp.planning.hardware import GIB
from spp.planning.pruning import plan
from spp.planning.shapes import shape_from_arch
from spp.projections import DEFAULT_TARGETS

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("llama7b", "llama13b", "llama30b", "llama65b", "llama2_70b")
PRUNERS = ("wanda", "sparsegpt")
WORLDS = (1, 8)
JSON_PATH = ROOT / "docs" / "results" / "pruning_plan.json"
DOC_PATH = ROOT / "docs" / "pruning.md"
BEGIN, END = "<!-- pruning-plan:begin -->\n", "<!-- pruning-plan:end -->\n"


def plan_rows() -> list[dict[str, Any]]:
    """One plan per model x pruner x GPU count, with the default :class:`~spp.planning.hardware.Hardware`."""
    rows = []
    for name in MODELS:
        arch = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml").arch)
        shape = shape_from_arch(name, arch, list(DEFAULT_TARGETS))
        for pruner in PRUNERS:
            rows += [plan(shape, world, pruner) for world in WORLDS]
    return rows


def as_json(rows: list[dict[str, Any]]) -> str:
    """The text of ``docs/results/pruning_plan.json``."""
    return json.dumps(rows, indent=1) + "\n"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table of ``docs/pruning.md`` and the assumptions it rests on."""
    hw, cal = rows[0]["hardware"], rows[0]["calibration"]
    lines = ["| model | params | pruner | GPUs | host RAM, rank-0 node | host RAM, any other node "
             "| GPU memory per device | est. time |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        host = r["host_bytes"]
        lines.append(f"| `{r['model']}` | {r['params'] / 1e9:.1f} B | {r['pruner']} | {r['world']} | "
                     f"{host['rank0_node'] / GIB:.0f} GiB (weights {host['weights'] / GIB:.0f}) | "
                     f"{host['other_nodes'] / GIB:.0f} GiB | {r['gpu_bytes_per_device'] / GIB:.1f} GiB | "
                     f"{r['seconds']['total'] / 60:.1f} min |")
    assumptions = (
        f"Assumptions (the defaults of `spp.planning.hardware.Hardware` and `Calibration`): {hw['gpus_per_node']} GPUs "
        f"of {hw['gpu_gib']:.0f} GiB per node; sustained {hw['bf16_tflops']:.0f} TFLOP/s bf16 (calibration forward "
        f"passes) and {hw['fp32_tflops']:.0f} TFLOP/s fp32 (SparseGPT's Hessians and solves); "
        f"{hw['column_overhead_s'] * 1e6:.0f} µs per SparseGPT column beyond its FLOPs; host-to-device copies at "
        f"{hw['h2d_gbps']:.0f} GB/s, broadcasts at {hw['broadcast_gbps']:.0f} GB/s, the checkpoint read at "
        f"{hw['disk_gbps']:.0f} GB/s; {hw['process_host_gib']:.0f} GiB of host memory and "
        f"{hw['process_gpu_gib']:.0f} GiB of GPU memory per process before any weight; bf16 weights; calibration "
        f"{cal['nsamples']} x {cal['seqlen']} tokens in batches of {cal['batch_size']}."
    )
    return "\n".join([*lines, "", textwrap.fill(assumptions, width=116)]) + "\n"


def with_table(doc: str, table: str) -> str:
    """``doc`` with the text between the plan's markers replaced by ``table``."""
    return replace_between(doc, BEGIN, END, table)


def main() -> None:
    rows = plan_rows()
    write_committed(JSON_PATH, as_json(rows), DOC_PATH, BEGIN, END, markdown(rows))


if __name__ == "__main__":
    main()
