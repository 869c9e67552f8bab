"""The finalize phase, on every rank after training: adapter files, the merged model's streamed export, its
evaluation spread over the ranks, and the guards' verdict (a diverged run's export goes to ``merged.diverged``).
"""

from __future__ import annotations

import gc
import logging
import math
import shutil
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.adapters.registry import apply_adapter, save_adapter_dir
from spp.adapters.trained_on import RECORD, zero_fingerprint
from spp.atomic import is_disk_full, write_dir_atomic
from spp.deepspeed_support import is_deepspeed
from spp.distributed import DistContext
from spp.errors import UserError
from spp.eval.evaluate import Evaluation, evaluate
from spp.export.manifest import ExportManifest, adapter_record
from spp.export.merged import ExportInputs, export_streamed, remove_stale_export
from spp.models.loading import load_skeleton
from spp.training.callbacks.pruning import PrunedModel, PruningRecord
from spp.training.config import TrainJobConfig
from spp.training.phases import FitResult, TrainingRecord
from spp.training.run import Run
from spp.training.strategies import trained_weights_dtype
from spp.training.trainer import resolve_precision

log = logging.getLogger(__name__)

DIVERGED_DIR = "merged.diverged"
"""Where the export of a run the guards refused is moved (beside the adapter files and checkpoints)."""


@dataclass
class FinalizeResult:
    """The finalize phase's result: the export's merge statistics and audit, the export's :class:`Evaluation`
    (``None`` when nothing was evaluated), output folders, seconds by part, and the run's status (``ok``,
    ``diverged`` with the guards' reasons, ``export_failed`` with its error)."""

    merge: dict[str, Any] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)
    evaluation: Evaluation | None = None
    merged_dir: str | None = None
    adapter_dir: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    status: str = "ok"
    diverged: list[str] = field(default_factory=list)
    export_error: UserError | None = None


def provenance(run: Run, pruned: PrunedModel | None = None) -> dict[str, Any]:
    """What the adapter was trained on top of (``adapter_config.json``, ``spp_export.json``); with ``pruned``
    also the record every loading path checks (:mod:`spp.adapters.trained_on`)."""
    job, ident = run.job, run.identity
    names = {"pruning": {"pruner": job.pruner.name, "sparsity": job.sparsity.name, "model": job.model.name,
                         "cache_key": ident.digest}}  # eval.py's W&B run names the pruned base with it
    if pruned is None or not len(pruned.zeros):
        return names
    record = {"model": {"name": job.model.name, "identity": ident.model, "dtype": job.model.torch_dtype},
              "pruning": None if ident.key is None else {"pruner": job.pruner.name, "sparsity": job.sparsity.name,
                                                         "cache_key": ident.digest, "key": ident.key},
              "masks": {**zero_fingerprint(pruned.zeros), "targets": sorted(job.pruner.targets)},
              "reconstruction": None if ident.reconstruction is None else
              dict(zip(("key", "cache_key"), ident.reconstruction, strict=True))}
    return {**names, RECORD: record}


def rebuild(job: TrainJobConfig, pruned: PrunedModel, state: dict[str, torch.Tensor]) -> nn.Module:
    """The adapted model, whole on rank 0's CPU, from the pruned weights it kept (``pruned.home``, no copy) and the
    gathered trainable tensors: what a sharded run writes its adapter files from."""
    if not pruned.home:
        raise RuntimeError("rebuilding the adapted model needs the pruned weights rank 0 keeps under sharding")
    model = load_skeleton(job.model)
    model.load_state_dict(pruned.home, assign=True)
    model, _ = apply_adapter(model, job.adapter, pruned.masks)
    missing = set(state) - set(model.state_dict())
    if missing:
        raise RuntimeError(f"gathered adapter tensors {sorted(missing)[:3]} do not exist in the rebuilt model")
    model.load_state_dict(state, strict=False)
    return model


def save_adapter_files(run: Run, pruned: PrunedModel, fitted: FitResult) -> str:
    """Rank 0: the adapter files in ``<run_dir>/adapter`` (atomic; a full disk is one :class:`UserError`)."""
    job, method = run.job, run.methods.adapter
    # sharded (FSDP2, ZeRO-3), or DeepSpeed's module copies rounded to bf16: rebuild with the gathered fp32 tensors
    model = fitted.model if not (fitted.sharded or fitted.deepspeed) else rebuild(job, pruned, fitted.state)
    path = run.run_dir / "adapter"
    try:
        write_dir_atomic(path, lambda tmp: save_adapter_dir(method, model, tmp, provenance(run, pruned), job.adapter))
    except Exception as err:
        if not is_disk_full(err):
            raise
        raise UserError(f"the disk filled up while writing the adapter files to {path} ({err}); nothing half-written "
                        "was kept", "free space there, or give this run another run_dir= on a disk with room",
                        key="export.adapter", path=path) from err
    return str(path)


def _manifest(run: Run) -> ExportManifest:
    """``spp_export.json``'s contents. The weights' dtype comes from the configuration (``model.torch_dtype``, cast
    by the resolved ``trainer.precision`` when a Trainer ran: :func:`trained_weights_dtype`), never from the
    parameters the fit phase holds: ZeRO-3 partitions are flat (1-D) and empty outside a gather."""
    job, trained = run.job, run.methods.trains
    precision = resolve_precision(job.trainer.precision, job.trainer.accelerator) if trained else "32-true"
    dtype = trained_weights_dtype(job.model.torch_dtype, precision, trained and is_deepspeed(job.strategy))
    return ExportManifest(adapter=adapter_record(job.adapter), dtype=str(dtype), **provenance(run))


def export(run: Run, pruned: PrunedModel, fitted: FitResult, ctx: DistContext, result: FinalizeResult) -> Path | None:
    """Every rank: the streamed export (``merged/``, or a temporary folder for evaluation only); ``None`` when the
    disk filled up (``result`` then says ``export_failed``)."""
    job, method = run.job, run.methods.adapter
    target = run.run_dir / ("merged" if job.export.merged else ".merged.evaluate")
    inputs = ExportInputs(method, pruned.zeros if ctx.is_main else None, pruned.tokenizer, _manifest(run),
                          fitted.state if fitted.deepspeed else {})
    try:
        exported = export_streamed(fitted.model, inputs, target, ctx)
    except UserError as err:
        result.status, result.export_error = "export_failed", err
        log.error("merged model not exported: %s", err)
        return None
    result.audit, result.merge = exported.audit, exported.merge
    result.seconds["export"] = exported.seconds
    if ctx.is_main:
        log.info("merged model exported to %s in %.1f s (%d shards, %d writer ranks); audit: sparsity %.4f, %d zeros "
                 "of %d, every pruned weight still zero (%d kept weights rounded to 0)", target, exported.seconds,
                 exported.layout["shards"], exported.layout["writers"], exported.audit["sparsity"],
                 exported.audit["zeros"], exported.audit["total"], exported.audit["kept_weights_zeroed"])
    return target


def release(fitted: FitResult, pruned: PrunedModel) -> None:
    """Drop every reference the job holds to the trained model, then return its memory: evaluation reads the export.

    A module still referenced elsewhere (DeepSpeed's engine keeps it) is named in a warning; the plan counts what
    it keeps (``spp.planning.run.kept_through_evaluation``).
    """
    trained = weakref.ref(fitted.model) if fitted.model is not None else None
    fitted.model, fitted.state = None, {}
    pruned.model, pruned.home, pruned.dense = None, {}, None
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if trained is not None and trained() is not None:
        holders = sorted({type(r).__name__ for r in gc.get_referrers(trained())} - {"frame", "list"})
        log.warning("the trained model is still referenced (by %s) after the finalize phase dropped it: its memory "
                    "stays in use during evaluation", ", ".join(holders) or "an unknown holder")


def finalize(run: Run, pruned: PrunedModel, fitted: FitResult, ctx: DistContext) -> FinalizeResult:
    """Adapter files, export, evaluation and guards, on every rank (see the module docstring)."""
    job, run_dir = run.job, run.run_dir
    result = FinalizeResult()
    start = time.perf_counter()
    if job.export.adapter and run.methods.trains:
        result.adapter_dir = ctx.on_main(lambda: save_adapter_files(run, pruned, fitted), UserError, long_wait=True)
        result.seconds["save_adapter"] = round(time.perf_counter() - start, 2)
    pruned.home = {}  # the pruned weights rank 0 kept for the adapter files: evaluation loads the export instead
    if ctx.is_main:
        clear_previous_exports(job, run_dir)
    needed = job.export.merged or job.eval.ppl or bool(job.eval.tasks) or job.sample.enabled
    target = export(run, pruned, fitted, ctx, result) if needed else None
    release(fitted, pruned)
    if target is None:
        return result
    sample = (job.sample.prompt, job.sample.max_new_tokens) if job.sample.enabled else None
    evaluation = evaluate(target, job.eval, ctx, data_dir=job.data_dir, sample=sample, label="merged")
    result.evaluation = evaluation
    result.seconds.update(evaluation.seconds)
    result.diverged = divergence(job, pruned.record, fitted.record, evaluation, run.methods.trains)
    result.status, result.merged_dir = ctx.on_main(lambda: _place(job, run_dir, target, result.diverged), UserError,
                                                long_wait=True)
    return result


def clear_previous_exports(job: TrainJobConfig, run_dir: Path) -> None:
    """Rank 0: a reused ``run_dir``'s ``merged.diverged/``, and its ``merged/`` when this run exports none
    (``export.merged=false``), belong to other weights: removed, so none loads as this run's. (``merged/`` itself is
    replaced by the export, which removes the old one first.)"""
    remove_stale_export(run_dir / DIVERGED_DIR)
    if not job.export.merged:
        remove_stale_export(run_dir / "merged")


def _place(job: TrainJobConfig, run_dir: Path, target: Path, diverged: list[str]) -> tuple[str, str | None]:
    """Rank 0: keep the export as ``merged/``, move a diverged one to ``merged.diverged/``, or remove a temporary;
    returns the run's status and the merged model's folder."""
    status, merged_dir = "ok", None
    if diverged:
        status = "diverged"
        moved = run_dir / DIVERGED_DIR
        if job.export.merged:
            manifest = ExportManifest.read(target)
            if manifest is not None:
                manifest.status = "diverged"
                manifest.write(target)
            target.rename(moved)  # a previous run's merged.diverged/ went in clear_previous_exports
        log.warning("run diverged (%s): the merged model is at %s, not at merged/; adapter and checkpoints kept in "
                    "%s", "; ".join(diverged), moved if job.export.merged else "(not kept)", run_dir)
    elif job.export.merged:
        merged_dir = str(target)
    if not job.export.merged:
        shutil.rmtree(target, ignore_errors=True)
    return status, merged_dir


LOSS_MIN_STEPS = 4
"""Fewer recorded training losses than this are not judged by ``guards.loss_must_fall`` (noise, not a trend)."""
LOSS_RISE_Z = 2.0
"""A rise counts only above this many standard errors of the difference of the two window means."""
LOSS_RISE_RTOL = 0.01
"""... and above this share of the first window's mean (5.504 -> 5.51 is not a rise)."""


def loss_rise(losses: list[float]) -> str | None:
    """Why the training loss rose over the run (``guards.loss_must_fall``), or ``None``.

    Compares the means of the first and last ``k`` losses: rose when the difference exceeds both
    :data:`LOSS_RISE_Z` standard errors and :data:`LOSS_RISE_RTOL` of the first.
    """
    n = len(losses)
    if n < LOSS_MIN_STEPS:
        return None
    k = 1 if n < 6 else min(10, n // 3)
    first, last = losses[:k], losses[-k:]
    mean_first, mean_last = sum(first) / k, sum(last) / k
    if not math.isfinite(mean_last):
        return f"final training loss is {mean_last} (mean of the last {k})"
    spread = 0.0
    if k > 1:
        var = (sum((x - mean_first) ** 2 for x in first) + sum((x - mean_last) ** 2 for x in last)) / (k - 1)
        spread = math.sqrt(var / k)
    margin = max(LOSS_RISE_Z * spread, LOSS_RISE_RTOL * abs(mean_first))
    if mean_last - mean_first > margin:
        return (f"final training loss {mean_last:.4g} exceeds the first {mean_first:.4g} (means of {k}) by more than "
                f"{margin:.3g} (the larger of 2 standard errors and 1 % of the first)")
    return None


def divergence(job: TrainJobConfig, pruned: PruningRecord, fitted: TrainingRecord, evaluation: Evaluation,
               trained: bool = True) -> list[str]:
    """Why the run must not be reported as a success (``guards.*``); empty when it may (``trained``: the adapter
    method trains, so its training loss is judged by :func:`loss_rise`)."""
    if not job.guards.enabled:
        return []
    reasons = []
    before = (pruned.ppl.get("pruned") or {}).get("ppl")
    after = (evaluation.ppl or {}).get("ppl")
    ratio = job.guards.max_ppl_ratio
    if after is not None and not math.isfinite(after):
        reasons.append(f"merged perplexity is {after}")
    elif after is not None and before is not None and math.isfinite(before) and after > ratio * before:
        reasons.append(f"merged perplexity {after:.4g} > guards.max_ppl_ratio={ratio:g} x pruned {before:.4g}")
    rise = loss_rise(fitted.train_losses) if job.guards.loss_must_fall and trained else None
    if rise:
        reasons.append(rise)
    return reasons
