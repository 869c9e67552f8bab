"""The run plan (``spp.planning``, ``train.py plan=true``) of the paper's 7 models on 1 GPU, 8 GPUs with FSDP2,
8 GPUs with DeepSpeed ZeRO-3 and 2 nodes x 8 GPUs with FSDP2, each composed as ``train.py`` composes it (the
overrides are in every row) and planned on the ``meta`` device; nothing is loaded.

    python benchmarks/run_plan.py   # writes docs/results/run_plan.json and the table in docs/plan.md

It also plans block-wise reconstruction alone (``reconstruct=blockwise trainer.max_steps=0``) of each model on one
80 GB GPU: ``docs/results/run_plan_reconstruct.json`` and the second table in ``docs/plan.md``.

``tests/test_plan_committed.py`` regenerates both and compares them with the committed files.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from lab.bench.common import replace_between, write_committed
from spp.planning.hardware import GIB, GPU_NODE
from spp.planning.job import plan_job
from spp.planning.reconstruction import HIDDEN_SETS
from spp.planning.report import as_json, time_text
from spp.preflight.model_files import model_arch
from spp.training.config import load_job, register_train_schema

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("llama7b", "llama13b", "llama30b", "llama65b", "llama2_7b", "llama2_13b", "llama2_70b")
COMMON = ("trainer=gpu", "data=alpaca_cleaned", "eval=paper", "pruner=sparsegpt", "sparsity=unstructured50")
"""The paper's recipe: the GPU trainer (bf16-mixed, global batch 128, gradient checkpointing), all of Alpaca-cleaned,
the paper's evaluation, SparseGPT (the pruner with the largest GPU and cache needs) at 50 %."""
SETUPS = {"1 GPU": ("strategy=auto", "trainer.devices=1"),
          "8 GPUs FSDP2": ("strategy=fsdp", "trainer.devices=8"),
          "8 GPUs ZeRO-3": ("strategy=deepspeed_stage3", "trainer.devices=8"),
          "2 x 8 GPUs FSDP2": ("strategy=fsdp", "trainer.devices=8", "trainer.num_nodes=2")}
JSON_PATH = ROOT / "docs" / "results" / "run_plan.json"
DOC_PATH = ROOT / "docs" / "plan.md"
BEGIN, END = "<!-- run-plan:begin -->\n", "<!-- run-plan:end -->\n"
TARGET_GIB = 72
"""The bound on the peak GPU memory per 80 GB device."""


def plan_rows() -> list[dict[str, Any]]:
    """One plan per model x setup, on :data:`~spp.planning.hardware.GPU_NODE` (80 GiB GPUs, host not checked)."""
    register_train_schema()
    rows = []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for model in MODELS:
            for setup, extra in SETUPS.items():
                overrides = [f"model={model}", *COMMON, *extra]
                job = load_job(compose("train", overrides=overrides))
                plan = plan_job(job, model_arch(job.model), "gpu", "hub", GPU_NODE)
                rows.append({"setup": setup, "overrides": overrides, **as_json(plan)})
    return rows


def as_text(rows: list[dict[str, Any]]) -> str:
    """The text of ``docs/results/run_plan.json``."""
    return json.dumps(rows, indent=1) + "\n"


def _phase(row: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in row["phases"] if p["name"] == name)


def _cell(row: dict[str, Any]) -> list[str]:
    gpu = [f"{_phase(row, n)['device_bytes'] / GIB:.1f}" if _phase(row, n)["device"] else "CPU"
           for n in ("prune", "fit", "evaluate")]
    host = max(row["phases"], key=lambda p: p["host_rank0_node_bytes"])
    ratio = host["host_rank0_node_bytes"] / row["weight_bytes"]
    disk = [sum(_phase(row, n)["disk"].values()) / GIB for n in ("prune", "fit", "export")]
    place = row["eval_placement"]
    fits = "yes" if not row["problems"] else "; ".join(f"no, {p['phase']}: {p['fix'].split(' (')[0]}"
                                                       for p in row["problems"])
    return [f"`{row['model']}`", row["setup"], *gpu, f"{host['host_rank0_node_bytes'] / GIB:.0f} ({host['name']}, "
            f"{ratio:.2f} x)", " / ".join(f"{d:.0f}" for d in disk), time_text(row["seconds"]),
            f"{place['replicas']} x {place['gpus_per_replica']} ({place['how']})", fits]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table of ``docs/plan.md`` and the assumptions it rests on."""
    head = ["model", "setup", "GPU GiB prune", "GPU GiB fit", "GPU GiB evaluate",
            "host GiB, rank-0 node (phase, x weights)", "disk GiB cache / checkpoints / export", "est. time",
            "evaluation replicas x GPUs", "fits 80 GiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(r)) + " |" for r in rows]
    hw = rows[0]["hardware"]
    assumptions = (
        f"Composed with `python train.py model=<model> {' '.join(COMMON)} <setup> plan=true` (the setup's overrides "
        f"are in each row of `docs/results/run_plan.json`). Machine: GPUs of {hw['device_gib']:.0f} GiB; "
        f"{hw['train_tflops']:.0f} TFLOP/s sustained per GPU for training and {hw['eval_tflops']:.0f} for "
        f"evaluation (assumed); {hw['process_host_bytes'] / GIB:.0f} GiB of host memory and "
        f"{hw['process_device_bytes'] / GIB:.0f} GiB of GPU memory per process before any tensor; checkpoint, cache "
        f"and export at {hw['disk_gbps']:.0f} GB/s. A row fits when every phase's GPU peak is within "
        f"{hw['device_gib']:.0f} GiB (host memory is not checked: the column states the need)."
    )
    return "\n".join([*lines, "", textwrap.fill(assumptions, width=116)]) + "\n"


def with_table(doc: str, table: str) -> str:
    """``doc`` with the text between the plan's markers replaced by ``table``."""
    return replace_between(doc, BEGIN, END, table)


RECONSTRUCT = ("reconstruct=blockwise", "trainer.max_steps=0", "trainer.devices=1", "trainer.device_memory_gib=79.2")
"""Block-wise reconstruction only (no training step) on one H100 80 GB (79.2 GiB as CUDA reports it), the schema's
128 windows x 2048 tokens, 3 epochs, SPP's form; the models in their bf16 weights."""
RECONSTRUCT_DTYPES = ("float32", "bfloat16")
"""``reconstruct.dtype``: the schema's default, then bf16."""
RECONSTRUCT_JSON = ROOT / "docs" / "results" / "run_plan_reconstruct.json"
RECONSTRUCT_BEGIN, RECONSTRUCT_END = "<!-- run-plan-reconstruct:begin -->\n", "<!-- run-plan-reconstruct:end -->\n"


def reconstruct_rows() -> list[dict[str, Any]]:
    """One plan per model x ``reconstruct.dtype``, on the machine ``plan=true`` assumes for these overrides."""
    from spp.planning.job import plan_hardware

    register_train_schema()
    rows = []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for model in MODELS:
            for dtype in RECONSTRUCT_DTYPES:
                overrides = [f"model={model}", *RECONSTRUCT, f"reconstruct.dtype={dtype}"]
                job = load_job(compose("train", overrides=overrides))
                plan = plan_job(job, model_arch(job.model), "gpu", "hub", plan_hardware(job, "gpu")[0])
                rows.append({"overrides": overrides, "reconstruct_dtype": dtype, **as_json(plan)})
    return rows


def _reconstruct_cells(row: dict[str, Any]) -> list[str]:
    phase = _phase(row, "reconstruct")
    sets = [v for k, v in phase["device"].items() if k in HIDDEN_SETS]
    terms = {f"{len(sets)} x {sets[0] / GIB:.1f} hidden states": sum(sets),
             **{f"{k} {v / GIB:.1f}": v for k, v in phase["device"].items() if k not in HIDDEN_SETS}}
    top = sorted(terms.items(), key=lambda kv: -kv[1])[:3]
    mine = [p for p in row["problems"] if p["phase"] == "reconstruct"]
    rest = sorted({p["phase"] for p in row["problems"]} - {"reconstruct"})
    fits = "yes" if not mine else "; ".join(f"no: {p['fix'].split(' (')[0]}" for p in mine)
    return [f"{phase['device_bytes'] / GIB:.1f} ({', '.join(k for k, _v in top)})",
            f"{phase['host_rank0_node_bytes'] / GIB:.0f}", time_text(phase["seconds_total"]), fits,
            ", ".join(rest) or "-"]


def reconstruct_markdown(rows: list[dict[str, Any]]) -> str:
    """The reconstruct-only table of ``docs/plan.md``: the reconstruct phase of each model on one GPU."""
    head = ["model", "reconstruct.dtype", "GPU GiB (largest terms)", "host GiB, rank 0", "est. time", "fits 1 GPU",
            "other phases of train.py that do not fit 1 GPU"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [f"| `{r['model']}` | {r['reconstruct_dtype']} | " + " | ".join(_reconstruct_cells(r)) + " |"
              for r in rows]
    hw = rows[0]["hardware"]
    note = (f"Composed with `python train.py model=<model> {' '.join(RECONSTRUCT)} reconstruct.dtype=<dtype> "
            f"plan=true`. GPU of {hw['device_gib']:g} GiB; host {hw['host_gib']:.0f} GiB per node (assumed); "
            f"{hw['train_tflops']:.0f} TFLOP/s in bf16 and {hw['prune_fp32_tflops']:.0f} in fp32 (assumed). "
            "\"fits\" is the reconstruct phase within the GPU and the node; the last column names the phases of "
            "the same train.py job that do not fit one GPU (it places the whole model on the GPU even without a "
            "training step, and evaluates it there).")
    return "\n".join([*lines, "", textwrap.fill(note, width=116)]) + "\n"


def main() -> None:
    rows = plan_rows()
    write_committed(JSON_PATH, as_text(rows), DOC_PATH, BEGIN, END, markdown(rows))
    again = reconstruct_rows()
    write_committed(RECONSTRUCT_JSON, as_text(again), DOC_PATH, RECONSTRUCT_BEGIN, RECONSTRUCT_END,
                    reconstruct_markdown(again))


if __name__ == "__main__":
    main()
