"""The preflight of the commands: everything ``train.py`` / ``prune.py`` can check before loading a weight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spp.atomic import check_writable_dir
from spp.deepspeed_support import check_deepspeed
from spp.errors import user_errors
from spp.planning.job import check_job
from spp.preflight.data_files import check_data_source, check_ppl_sources
from spp.preflight.model_files import model_arch
from spp.preflight.reconstruction import check_reconstruct
from spp.preflight.shapes import check_shapes
from spp.preflight.vocab import check_vocab
from spp.pruning.base import Pruner
from spp.pruning.calibration_data import check_calibration_source
from spp.pruning.registry import needs_calibration
from spp.training.resume_checks import check_resume
from spp.training.run import Methods, resolve_methods

CACHE_DIR_FIX = "point cache_dir= (or the SPP_CACHE_DIR environment variable) at a directory you can write to"


def preflight_train(job: Any, resume: str | None = None, methods: Methods | None = None) -> dict[str, Any]:
    """Everything ``train.py`` can check before loading a weight; returns the model's arch fields. ``methods``: the
    job's resolved methods (:func:`~spp.training.run.resolve_methods`, called here when not given)."""
    methods = methods if methods is not None else resolve_methods(job)
    if methods.trains:
        check_deepspeed(job.strategy, job.trainer.accelerator, methods.adapter)
    check_pruner(methods.pruner, job.sparsity)
    prunes = methods.pruner is not None  # a pruner and a pattern that is not dense
    arch = model_arch(job.model)
    seqlens = {"data.max_length": job.data.max_length}
    if prunes:
        seqlens["calibration.seqlen"] = job.calibration.seqlen
    if job.eval.ppl:
        seqlens["eval.seqlen"] = job.eval.seqlen
    check_shapes(arch, adapter=job.adapter, sparsity=job.sparsity, pruner=job.pruner, seqlens=seqlens,
                 method=methods.adapter)
    check_vocab(job.model, arch)
    check_reconstruct(job.reconstruct, arch, job.data_dir, job.model, methods.form)
    check_job(job, arch, methods)  # the memory plan: every phase fits this machine's GPUs and host (docs/plan.md)
    if methods.trains:
        check_data_source(job.data.source, job.data_dir)
    if prunes and needs_calibration(job.pruner, job.sparsity):
        check_calibration_source(job.calibration, job.data_dir, job.model)
    if job.eval.ppl:
        check_ppl_sources([job.eval.ppl_source, *job.eval.extra_ppl_sources], job.data_dir)
    if resume:
        check_resume(job, resume)
    caches = ["pruning"] if prunes else []
    check_cache_dirs(job.cache_dir, caches + (["ppl"] if job.eval.ppl and (job.dense_ppl or job.pruned_ppl) else []))
    return arch


def preflight_prune(job: Any, methods: Methods) -> dict[str, Any]:
    """Everything ``prune.py`` can check before loading a weight (``methods``: the job's resolved methods)."""
    arch = model_arch(job.model)
    check_pruner(methods.pruner, job.sparsity)
    calibrates = needs_calibration(job.pruner, job.sparsity)
    seqlens = {"calibration.seqlen": job.calibration.seqlen} if calibrates else {}
    check_shapes(arch, sparsity=job.sparsity, pruner=job.pruner, seqlens=seqlens)
    check_vocab(job.model, arch)
    check_reconstruct(job.reconstruct, arch, job.data_dir, job.model, methods.form)
    if calibrates:
        check_calibration_source(job.calibration, job.data_dir, job.model)
    if job.use_cache and methods.pruner is not None:
        check_cache_dirs(job.cache_dir, ["pruning"])
    return arch


def check_pruner(pruner: Pruner | None, sparsity: Any) -> None:
    """The resolved pruner (``None``: nothing is pruned; an unknown name was refused when it was resolved) accepts
    the pattern (:meth:`spp.pruning.base.Pruner.check`: SparseGPT's ``blocksize`` vs ``sparsity.m``)."""
    if pruner is None:
        return
    with user_errors(ValueError):
        pruner.check(sparsity)


def check_cache_dirs(cache_dir: str, subdirs: list[str]) -> None:
    """The caches the job will write (``<cache_dir>/pruning``, ``<cache_dir>/ppl``) are writable directories."""
    for sub in subdirs:
        check_writable_dir(Path(cache_dir).expanduser() / sub, "cache_dir", CACHE_DIR_FIX, value=cache_dir)
