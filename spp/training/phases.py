"""The phases of a training job as plain functions with typed results: ``fit`` (prune → train) → ``finalize``.

* :func:`fit` builds the Lightning ``Trainer`` with the :class:`~spp.training.callbacks.pruning.PruningCallback`
  first among its callbacks and runs ``Trainer.fit`` on every rank. In ``setup`` the callback loads and prunes
  the model through the on-disk cache with every rank taking part (calibration batches and perplexity windows
  split over the ranks; the model never whole on a device); ``SPPModule.configure_model`` then attaches the
  adapter and gives every rank its part of the model from rank 0; training follows. Afterwards the trainable
  tensors are gathered once and the process group is closed. ``adapter=none`` prunes without a Trainer.
* :func:`finalize` runs on global rank 0 alone, after every collective is over: adapter files, merge, the
  zero audit of the merged model, perplexity and lm-eval tasks, and the merged model's export.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from torch import nn

from spp.adapters.base import ParamCounts, count_parameters
from spp.adapters.registry import apply_adapter, get_method
from spp.atomic import is_disk_full, write_dir_atomic, write_json_atomic
from spp.data.alpaca import AlpacaDataModule
from spp.distributed import local_device
from spp.errors import UserError
from spp.eval.harness import run_eval_tasks
from spp.eval.ppl_cache import cached_perplexity
from spp.models.loading import load_model, load_tokenizer
from spp.preflight import settings_of
from spp.pruning.cache import get_or_prune
from spp.quiet import quiet_lightning
from spp.training.callbacks.adapter_checkpoint import resolve_resume
from spp.training.callbacks.guards import GuardsCallback
from spp.training.callbacks.pruning import PrunedModel, PruningCallback, PruningSettings, ppl_text, sample
from spp.training.callbacks.sparsity_audit import SparsityAuditCallback, audit
from spp.training.config import ProgressBar, TrainJobConfig
from spp.training.module import SPPModule
from spp.training.strategies import decoder_layer_class, gather_trainable, is_sharded
from spp.training.trainer import build_trainer, peak_memory, progress_mode, train_seconds

log = logging.getLogger(__name__)


@dataclass
class FitResult:
    """The fit phase's result: the adapted model when it is whole in this process, and the gathered state."""

    model: nn.Module | None
    state: dict[str, torch.Tensor]
    params: ParamCounts
    steps: int = 0
    train_losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    audits: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] | None = None
    seconds: float = 0.0
    is_global_zero: bool = True
    memory: dict[str, Any] = field(default_factory=dict)


@dataclass
class FinalizeResult:
    """The finalize phase's result: merge statistics, the merged model's audit and scores, and output paths."""

    merge: dict[str, Any]
    audit: dict[str, Any]
    ppl: dict[str, Any] | None = None
    zero_shot: dict[str, Any] | None = None
    merged_dir: str | None = None
    adapter_dir: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    status: str = "ok"
    diverged: list[str] = field(default_factory=list)
    sample: dict[str, Any] | None = None
    export_error: UserError | None = None


def job_device(job: TrainJobConfig) -> torch.device:
    """Where rank 0 evaluates at the end: its own GPU (from the launcher's environment) or the CPU."""
    return local_device(job.trainer.accelerator)


def pruning_settings(job: TrainJobConfig) -> PruningSettings:
    """What the pruning callback needs of ``job``."""
    return PruningSettings(job.model, job.pruner, job.sparsity, job.calibration, job.cache_dir, job.data_dir,
                           job.eval, job.dense_ppl, job.pruned_ppl,
                           (job.sample.prompt, job.sample.max_new_tokens) if job.sample.enabled else None,
                           job.cache_lock_timeout_s)


def fit(job: TrainJobConfig, run_dir: Path, loggers: list[Logger],
        callbacks: list[Callback] | None = None) -> tuple[PrunedModel, FitResult]:
    """Prune (in the Trainer's setup, every rank) and train the adapter (every rank); returns both results."""
    quiet_lightning()
    L.seed_everything(job.seed, workers=True)
    tokenizer = load_tokenizer(job.model)
    pruning = PruningCallback(pruning_settings(job), tokenizer, everywhere=False)
    if not get_method(job.adapter.name).trains:
        return _untrained(job, pruning)
    datamodule = AlpacaDataModule(tokenizer, job.data, data_dir=job.data_dir,
                                  progress=progress_mode(job.trainer.progress_bar) in (ProgressBar.rich,
                                                                                       ProgressBar.tqdm))
    datamodule.setup("fit")  # bad data (e.g. every prompt longer than data.max_length) fails before the Trainer
    module = SPPModule(None, job.trainer, job.strategy, decoder_layer_class(job.model.decoder_layer_cls),
                       adapter=job.adapter, seed=job.seed)
    auditor = SparsityAuditCallback(source=pruning)
    guards = GuardsCallback(settings_of(job), job.guards)
    trainer = build_trainer(job, run_dir, loggers, [pruning, auditor, guards, *(callbacks or [])])
    resume = resolve_resume(job.trainer.resume_from, run_dir / "checkpoints")
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
    losses = module.train_losses
    if trainer.is_global_zero:
        log.info("training done: %d optimiser steps in %.1f s, train loss %s, val loss %s", trainer.global_step,
                 train_seconds(trainer), f"{losses[0]:.3f} → {losses[-1]:.3f}" if losses else "-",
                 " → ".join(f"{v:.3f}" for v in module.val_losses) or "-")
    state = gather_trainable(trainer.strategy, module.model)
    whole = None if is_sharded(trainer.strategy) else module.model
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # finalize runs on rank 0 alone: no collective may stay open
    memory = peak_memory(trainer.strategy.root_device)
    for logger in loggers:
        logger.log_metrics({"train/peak_memory_mib": memory["peak_mib"]}, step=trainer.global_step)
    return pruning.pruned, FitResult(whole, state, module.params, trainer.global_step, module.train_losses,
                                     module.val_losses, auditor.reports, datamodule.summary(),
                                     round(train_seconds(trainer), 2), trainer.is_global_zero, memory)


def _untrained(job: TrainJobConfig, pruning: PruningCallback) -> tuple[PrunedModel, FitResult]:
    """``adapter=none``: prune in this process (no Trainer), attach nothing, audit."""
    pruned = pruning.run_alone(job_device(job))
    model, _ = apply_adapter(pruned.model, job.adapter, pruned.masks)
    report = audit(model, pruned.masks, pruned.zeros, when="fit_start")
    return pruned, FitResult(model, {}, count_parameters(model), audits=[{"when": "fit_start", "step": 0, **report}])


def rebuild(job: TrainJobConfig, state: dict[str, torch.Tensor]) -> nn.Module:
    """The adapted model, whole, from the pruning cache and the gathered trainable state (after sharding)."""
    model, _ = load_model(job.model, with_tokenizer=False)
    result = get_or_prune(model, None, job.model, job.pruner, job.sparsity, job.calibration, job.cache_dir,
                          job.data_dir)
    model, _ = apply_adapter(model, job.adapter, {k: v.bool() for k, v in result.masks.items()})
    missing = set(state) - set(model.state_dict())
    if missing:
        raise RuntimeError(f"gathered adapter tensors {sorted(missing)[:3]} do not exist in the rebuilt model")
    model.load_state_dict(state, strict=False)
    return model


def finalize(job: TrainJobConfig, pruned: PrunedModel, fitted: FitResult, run_dir: Path) -> FinalizeResult:
    """Adapter files, merge, audit of the merged zeros, evaluation and export (global rank 0, no collective)."""
    method = get_method(job.adapter.name)
    log.info("finalize phase: adapter files, merge, audit, evaluation, export")
    model = (fitted.model if fitted.model is not None else rebuild(job, fitted.state)).eval()
    seconds: dict[str, float] = {}
    adapter_dir = None
    if job.export.adapter and method.trains:
        start = time.perf_counter()
        adapter_dir = str(export_dir(run_dir / "adapter", lambda tmp: method.save(model, tmp, _provenance(job)), 0,
                                     "the adapter files", "free space there, or give this run another run_dir= on a "
                                     "disk with room", key="export.adapter"))
        seconds["save_adapter"] = round(time.perf_counter() - start, 2)
        log.info("adapter files: %s", adapter_dir)
    start = time.perf_counter()
    merged, stats = method.merge(model, job.adapter, pruned.masks)
    seconds["merge"] = round(time.perf_counter() - start, 2)
    checked = audit(merged, pruned.masks, pruned.zeros, when="merged",
                    kept_zeros_may_change=method.kept_zeros_may_change)
    log.info("merged in %.1f s; audit: sparsity %.4f, %d zeros of %d, every pruned weight still zero",
             seconds["merge"], checked.get("sparsity", float("nan")), checked.get("zeros", 0), checked.get("total", 0))
    result = FinalizeResult(stats, checked, adapter_dir=adapter_dir, seconds=seconds)
    _evaluate(job, merged.to(job_device(job)), pruned.tokenizer, result)
    result.diverged = divergence(job, pruned, fitted, result)
    if result.diverged:
        result.status = "diverged"
        log.warning("run diverged (%s): the merged model is not exported; adapter and checkpoints kept in %s",
                    "; ".join(result.diverged), run_dir)
    elif job.export.merged:
        start = time.perf_counter()
        try:
            result.merged_dir = str(export_merged(job, merged.cpu(), pruned.tokenizer, run_dir / "merged"))
        except UserError as err:  # the disk is full: summary.json still says what happened
            result.status, result.export_error = "export_failed", err
            log.error("merged model not exported: %s", err)
            return result
        seconds["save_merged"] = round(time.perf_counter() - start, 2)
        log.info("merged model: %s (%.1f s)", result.merged_dir, seconds["save_merged"])
    return result


LOSS_MIN_STEPS = 4
"""Fewer recorded training losses than this are not judged by ``guards.loss_must_fall`` (noise, not a trend)."""
LOSS_RISE_Z = 2.0
"""A rise counts only above this many standard errors of the difference of the two window means."""
LOSS_RISE_RTOL = 0.01
"""... and above this share of the first window's mean (5.504 -> 5.51 is not a rise)."""


def loss_rise(losses: list[float]) -> str | None:
    """Why the training loss rose over the run (``guards.loss_must_fall``), or ``None``.

    Compares the mean of the first and of the last ``k`` losses (``k`` = a third of them, 2 to 10; 1 below 6
    losses). Rose: the last mean is not finite, or exceeds the first by more than :data:`LOSS_RISE_Z` standard
    errors of the difference *and* by more than :data:`LOSS_RISE_RTOL` of the first. Fewer than
    :data:`LOSS_MIN_STEPS` losses are not judged.
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


def divergence(job: TrainJobConfig, pruned: PrunedModel, fitted: FitResult, result: FinalizeResult) -> list[str]:
    """Why the run must not be reported as a success (``guards.*``); empty when it may.

    Diverged: the merged perplexity is not finite or exceeds ``guards.max_ppl_ratio`` × the pruned model's, or
    (``guards.loss_must_fall``) the training loss rose beyond its noise (:func:`loss_rise`).
    """
    if not job.guards.enabled:
        return []
    reasons = []
    before = (pruned.ppl.get("pruned") or {}).get("ppl")
    after = (result.ppl or {}).get("ppl")
    ratio = job.guards.max_ppl_ratio
    if after is not None and not math.isfinite(after):
        reasons.append(f"merged perplexity is {after}")
    elif after is not None and before is not None and math.isfinite(before) and after > ratio * before:
        reasons.append(f"merged perplexity {after:.4g} > guards.max_ppl_ratio={ratio:g} x pruned {before:.4g}")
    rise = loss_rise(fitted.train_losses) if job.guards.loss_must_fall and get_method(job.adapter.name).trains else None
    if rise:
        reasons.append(rise)
    return reasons


def _evaluate(job: TrainJobConfig, merged: nn.Module, tokenizer: Any, result: FinalizeResult) -> None:
    """Perplexity (not cached: the merged weights are new) and the lm-eval tasks of ``eval.tasks``."""
    device = next(merged.parameters()).device
    if job.sample.enabled:
        result.sample = sample(job.sample.prompt, job.sample.max_new_tokens, merged, tokenizer)
    if job.eval.ppl:
        log.info("evaluating the merged model: perplexity")
        result.ppl = cached_perplexity(merged, tokenizer, job.eval, "merged", None, job.data_dir, device)
        log.info("merged perplexity: %s", ppl_text(result.ppl))
    if job.eval.tasks:
        start = time.perf_counter()
        harness = run_eval_tasks(merged, tokenizer, job.eval, job.data_dir)
        result.zero_shot = {"metrics": harness.metrics, "zero_shot_mean": harness.zero_shot_mean,
                            "mmlu_acc": harness.mmlu_acc, "limit": harness.limit, "mmlu_limit": job.eval.mmlu_limit,
                            "num_fewshot": harness.num_fewshot}
        result.seconds["zero_shot"] = round(time.perf_counter() - start, 2)
        log.info("eval tasks %s: zero-shot mean %s, MMLU %s (%.1f s)", list(job.eval.tasks), harness.zero_shot_mean,
                 harness.mmlu_acc, result.seconds["zero_shot"])


def _provenance(job: TrainJobConfig) -> dict[str, Any]:
    """What the adapter was trained on top of (stored in ``adapter_config.json`` and ``spp_export.json``)."""
    return {"pruning": {"pruner": job.pruner.name, "sparsity": job.sparsity.name, "model": job.model.name}}


EXPORT_SLACK_BYTES = 32 * 2**20
"""Room an export needs beyond its tensors (tokenizer and JSON files), on top of 1 % of the tensors' bytes."""


def tensor_bytes(model: nn.Module) -> int:
    """Bytes of the model's distinct tensors (tied ones once): about what ``save_pretrained`` writes."""
    seen: set[int] = set()
    total = 0
    for tensor in model.state_dict().values():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def _size(n: float) -> str:
    """``1.2 GiB``, ``512.0 KiB``, ``12 B``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def export_dir(path: Path, writer: Callable[[Path], Any], needed: int, what: str, fix: str,
               key: str = "export.merged") -> Path:
    """:func:`spp.atomic.write_dir_atomic` after checking that ``needed`` bytes are free beside ``path``.

    Raises:
        UserError: too little free space (before anything is written), or the disk filled up while writing
            (the temporary folder is removed; an earlier ``path`` stays as it was).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < needed:
        raise UserError(f"not enough disk space to export {what} to {path}: it needs about {_size(needed)}, "
                        f"{_size(free)} free there; nothing was written", fix, key=key, path=path)
    try:
        return write_dir_atomic(path, writer)
    except Exception as err:
        if not is_disk_full(err):
            raise
        free = shutil.disk_usage(path.parent).free
        raise UserError(f"the disk filled up while exporting {what} to {path} (needs about {_size(needed)}, "
                        f"{_size(free)} free now; {type(err).__name__}: {err}); nothing half-written was kept",
                        fix, key=key, path=path) from err


def export_merged(job: TrainJobConfig, merged: nn.Module, tokenizer: Any, path: Path) -> Path:
    """``save_pretrained`` of the merged sparse model + tokenizer + ``spp_export.json``, atomically.

    Checks the free space first (the tensors' bytes + 1 % + :data:`EXPORT_SLACK_BYTES`); a full disk, before or
    during the write, is a :class:`UserError` naming the path, the bytes needed and free, and the fix.
    """

    def write(tmp: Path) -> None:
        merged.save_pretrained(tmp, max_shard_size=job.export.max_shard_size)
        tokenizer.save_pretrained(tmp)
        adapter = {k: str(v) if not isinstance(v, (bool, int, float, list)) else v
                   for k, v in vars(job.adapter).items()}
        write_json_atomic(tmp / "spp_export.json", {"adapter": adapter, "dtype": str(next(merged.parameters()).dtype),
                                                    **_provenance(job)})

    needed = tensor_bytes(merged) * 101 // 100 + EXPORT_SLACK_BYTES
    return export_dir(path, write, needed, "the merged model", f"free space there, or give this run another run_dir= "
                      f"on a disk with room, or set export.merged=false (adapter files and checkpoints stay in "
                      f"{path.parent})")
