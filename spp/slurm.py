"""The Slurm request of a sweep (``hydra/launcher=slurm``), planned per job in the launcher before ``sbatch``.

An array shares one request and the base config lacks the swept values, so :func:`plan_array` plans each job's
composed config; ``mem_gb: null`` becomes the largest host peak plus :data:`MARGIN` and :data:`SLACK_GIB` (the Slurm
step and page cache count in the cgroup), a given ``mem_gb`` / ``device_memory_gib`` is checked, and
``tasks_per_node`` must equal ``gpus_per_node``. A failed check: one stderr line, exit 2, nothing queued."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from spp.errors import EXIT_USER_ERROR, UserError, report, task_config, to_job
from spp.planning.check import problems
from spp.planning.hardware import GIB, for_accelerator
from spp.planning.job import job_hardware, missing_shape, model_source, plan_job
from spp.planning.pruning import Calibration
from spp.planning.pruning import plan as pruning_plan
from spp.planning.run import SHARD_BYTES
from spp.planning.shapes import dtype_bytes, shape_from_arch
from spp.preflight.model_files import model_arch
from spp.projections import DEFAULT_TARGETS
from spp.training.config import TrainJobConfig

MARGIN = 1.10
"""Memory requested per node = the plan's peak x this + :data:`SLACK_GIB`."""

SLACK_GIB = 2
"""GiB added to every request (the Slurm step's own processes)."""


def _arch(model: Any) -> dict[str, Any]:
    arch = model_arch(model)
    if missing_shape(arch):
        raise UserError(f"hydra.launcher.mem_gb=null asks the plan for the memory, but model.path={model.path!r} gives "
                        "no shape without loading it", "set hydra.launcher.mem_gb=<GB per node>, or the model's "
                        "fields under model.arch", key="hydra.launcher.mem_gb")
    return arch


def follows_slurm(cfg: DictConfig) -> bool:
    """Whether ``trainer.devices`` is read from Slurm's environment on the node (``trainer=slurm``)."""
    raw = OmegaConf.to_container(cfg.trainer, resolve=False).get("devices") if "trainer" in cfg else None
    return "SLURM_GPUS_ON_NODE" in str(raw)


def train_need(cfg: DictConfig, gpus: int, nodes: int) -> tuple[int, list[str]]:
    """``(host bytes per node, problems)`` of a ``train.py`` job on ``gpus`` GPUs (0: CPU) x ``nodes``."""
    job = to_job(task_config(cfg), TrainJobConfig)
    kind = "gpu" if gpus else "cpu"
    for key, mine, asked, slurm in (("devices", job.trainer.devices, gpus, "gpus_per_node"),
                                    ("num_nodes", job.trainer.num_nodes, nodes, "nodes")):
        if not follows_slurm(cfg) and str(mine).isdigit() and int(mine) != max(asked, 1):  # Lightning refuses it late
            raise UserError(f"trainer.{key}={mine} but the Slurm job asks hydra.launcher.{slurm}={asked}: Lightning "
                            "runs one process per device and per Slurm task", f"use trainer=slurm (devices and nodes "
                            f"from Slurm) or hydra.launcher.{slurm}={mine}", key=f"hydra.launcher.{slurm}")
    hw = job_hardware(job, kind, detect=False)
    if not job.trainer.device_memory_gib:
        hw = replace(hw, device_gib=None)  # the node's GPU, unknown here: the job's preflight checks it
    plan = plan_job(job, _arch(job.model), kind, model_source(job), hw, devices=max(gpus, 1), nodes=nodes)
    found = [f"the {p.phase} phase needs {p.need / GIB:.1f} GiB per GPU, more than trainer.device_memory_gib="
             f"{p.have / GIB:g}" for p in problems(plan) if p.memory == "GPU"]
    return plan.peak_host_node_bytes, found


def other_need(cfg: DictConfig, gpus: int, nodes: int) -> int:
    """Host bytes per node of ``prune.py`` (the pruning plan) or ``eval.py`` / ``generate.py`` (the weights once,
    a safetensors shard in flight and one process per GPU)."""
    model = OmegaConf.to_object(cfg.model)
    arch = _arch(model)
    shape = shape_from_arch(model.name, arch, list(DEFAULT_TARGETS), dtype_bytes(model.torch_dtype))
    hw = for_accelerator("gpu" if gpus else "cpu")
    if "calibration" in cfg and "pruner" in cfg:
        cal = cfg.calibration
        world = max(gpus, 1) * nodes
        out = pruning_plan(shape, world, str(cfg.pruner.name), replace(hw, gpus_per_node=max(gpus, 1)),
                           Calibration(int(cal.nsamples), int(cal.seqlen), int(cal.batch_size)))
        return int(out["host_bytes"]["rank0_node"])
    return shape.weight_bytes + min(shape.weight_bytes, SHARD_BYTES) + max(gpus, 1) * hw.process_host_bytes


def requested(cfgs: Sequence[DictConfig], params: dict[str, Any]) -> dict[str, Any]:
    """The launcher parameters to set for the jobs ``cfgs`` (module docstring), or a :class:`UserError`."""
    gpus, nodes, tasks = int(params.get("gpus_per_node") or 0), int(params.get("nodes") or 1), params["tasks_per_node"]
    if int(tasks) != max(gpus, 1):
        raise UserError(f"hydra.launcher.tasks_per_node={tasks} but gpus_per_node={gpus}: Lightning's SLURM "
                        "environment runs one task per GPU (one on a CPU job)",
                        f"set hydra.launcher.tasks_per_node={max(gpus, 1)}",
                        key="hydra.launcher.tasks_per_node")
    need, found = 0, []
    for cfg in cfgs:
        if "adapter" in cfg and "trainer" in cfg:
            bytes_, issues = train_need(cfg, gpus, nodes)
            found += issues
        else:
            bytes_ = other_need(cfg, gpus, nodes)
        need = max(need, bytes_)
    if found:
        raise UserError(found[0], "ask more GPUs (hydra.launcher.gpus_per_node, nodes) or see plan=true",
                        key="hydra.launcher.gpus_per_node")
    want = math.ceil(need / GIB * MARGIN + SLACK_GIB)
    given = params.get("mem_gb")
    if given is None:
        return {"mem_gb": want}
    if int(given) < want:
        raise UserError(f"hydra.launcher.mem_gb={given} is below the plan's {need / GIB:.1f} GiB of host memory per "
                        f"node (with margin: {want} GB)", f"set hydra.launcher.mem_gb={want}, or null to take it "
                        "from the plan", key="hydra.launcher.mem_gb")
    return {}


def plan_array(loader: Any, config: DictConfig, job_overrides: Sequence[Sequence[str]],
               params: dict[str, Any]) -> dict[str, Any]:
    """The launcher parameters to set for the array ``job_overrides`` (:func:`requested`, every job's config
    composed by Hydra's ``loader`` as the node will); a :class:`UserError` is one line on stderr and exit 2."""
    try:
        cfgs = [loader.load_sweep_config(config, list(o)) for o in job_overrides]
        return requested(cfgs, params)
    except UserError as err:
        report(os.path.basename(sys.argv[0]) or "spp", err)
        raise SystemExit(EXIT_USER_ERROR) from err
