"""The phases of a training job as plain functions with typed results: ``fit`` (prune → train), then
``spp.training.finalize.finalize`` (adapter files, export, evaluation, guards), each on every rank.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DeepSpeedStrategy, ModelParallelStrategy
from torch import nn

from spp.adapters.base import ParamCounts, count_parameters
from spp.adapters.registry import apply_adapter
from spp.data.alpaca import AlpacaDataModule
from spp.distributed import local_device
from spp.loggers import continue_csv_metrics
from spp.models.loading import load_tokenizer
from spp.quiet import quiet_lightning
from spp.training.callbacks.adapter_checkpoint import resolve_resume
from spp.training.callbacks.guards import GuardsCallback
from spp.training.callbacks.pruning import PrunedModel, PruningCallback, PruningSettings
from spp.training.callbacks.recovery_curve import curve_callbacks
from spp.training.callbacks.sparsity_audit import SparsityAuditCallback, audit
from spp.training.module import SPPModule
from spp.training.resume_checks import settings_of
from spp.training.run import Run
from spp.training.strategies import decoder_layer_class, gather_trainable
from spp.training.trainer import build_trainer, peak_memory, shows_bar, train_seconds
from spp.training.val_schedule import check_validation_interval

log = logging.getLogger(__name__)


@dataclass
class TrainingRecord:
    """What the report reads of training: parameter counts, optimiser steps, losses (the objective's, and its parts
    in ``train_parts``), audits, data summary, time and memory, and the recovery curve's points
    (``trainer.curve_every_n_steps``; ``None`` when off)."""

    params: ParamCounts
    steps: int = 0
    train_losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    train_parts: dict[str, list[float]] = field(default_factory=dict)
    audits: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] | None = None
    seconds: float = 0.0
    memory: dict[str, Any] = field(default_factory=dict)
    recovery_curve: list[dict[str, Any]] | None = None


@dataclass
class FitResult:
    """The fit phase's result: what finalize reads — the adapted model as this rank holds it (whole, its FSDP2 shards
    when ``sharded``; DeepSpeed's module when ``deepspeed``) and the gathered trainable tensors (rank 0) — and the
    :class:`TrainingRecord` the report reads."""

    model: nn.Module | None
    state: dict[str, torch.Tensor]
    record: TrainingRecord
    is_global_zero: bool = True
    sharded: bool = False
    deepspeed: bool = False


class KeepPrunedWeights(Callback):
    """Global rank 0 keeps references to the pruned weights (``PrunedModel.home``, no copy) before
    ``configure_model`` shards, for :func:`spp.training.finalize.rebuild`."""

    def __init__(self, pruning: PruningCallback) -> None:
        self.pruning = pruning

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Keep the references once (sharding drops the module's own)."""
        pruned = self.pruning.pruned
        if (trainer.is_global_zero and pruned is not None and not pruned.home and pruned.model is not None
                and isinstance(trainer.strategy, (ModelParallelStrategy, DeepSpeedStrategy))):
            pruned.home = dict(pruned.model.state_dict())


def pruning_callback_settings(run: Run) -> PruningSettings:
    """What the pruning callback needs of the run; the dense model is kept (``keep_dense``) when the training
    objective has a teacher and something trains."""
    job = run.job
    needs_dense = run.methods.trains and run.methods.adapter.needs_dense(job.adapter)  # config completed from it
    return PruningSettings(job.model, job.pruner, job.sparsity, job.calibration, job.cache_dir, job.data_dir,
                           job.eval, job.dense_ppl, job.pruned_ppl,
                           (job.sample.prompt, job.sample.max_new_tokens) if job.sample.enabled else None,
                           job.cache_lock_timeout_s, keep_dense=run.methods.keeps_dense,
                           reconstruct=job.reconstruct, pruner_method=run.methods.pruner,
                           form=run.methods.form, identity=run.identity,
                           adapter=(run.methods.adapter, job.adapter) if needs_dense else None)


def fit(run: Run, loggers: list[Logger], callbacks: list[Callback] | None = None) -> tuple[PrunedModel, FitResult]:
    """Prune (in the Trainer's setup, every rank) and train the adapter (every rank); returns both results."""
    job, run_dir = run.job, run.run_dir
    quiet_lightning()
    L.seed_everything(job.seed, workers=True)
    tokenizer = load_tokenizer(job.model)
    pruning = PruningCallback(pruning_callback_settings(run), tokenizer, everywhere=False)
    if not run.methods.trains:
        return _untrained(run, pruning)
    datamodule = AlpacaDataModule(tokenizer, job.data, data_dir=job.data_dir,
                                  progress=shows_bar(job.trainer.progress_bar))
    datamodule.setup("fit")  # bad data (e.g. every prompt longer than data.max_length) fails before the Trainer
    check_validation_interval(job, len(datamodule.train_dataset))
    module = SPPModule(None, job.trainer, job.strategy, decoder_layer_class(job.model.decoder_layer_cls),
                       adapter=job.adapter, seed=job.seed, objective=run.methods.objective,
                       method=run.methods.adapter)
    auditor = SparsityAuditCallback(source=pruning)
    guards = GuardsCallback(settings_of(job, run.identity), job.guards)
    curve = curve_callbacks(job, run_dir, tokenizer, run.methods.adapter)  # before pruning: its setup checks
    trainer = build_trainer(job, run_dir, loggers, [*curve, pruning, KeepPrunedWeights(pruning), auditor, guards,
                                                    *(callbacks or [])])
    resume = resolve_resume(job.trainer.resume_from, run_dir / "checkpoints")
    if resume is not None:
        continue_csv_metrics(loggers)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
    losses = module.train_losses
    if trainer.is_global_zero:
        log.info("training done: %d optimiser steps in %.1f s, train loss %s, val loss %s", trainer.global_step,
                 train_seconds(trainer), f"{losses[0]:.3f} → {losses[-1]:.3f}" if losses else "-",
                 " → ".join(f"{v:.3f}" for v in module.val_losses) or "-")
    state = gather_trainable(trainer.strategy, module.model)
    memory = peak_memory(trainer.strategy.root_device)
    for logger in loggers:
        logger.log_metrics({"train/peak_memory_mib": memory["peak_mib"]}, step=trainer.global_step)
    record = TrainingRecord(module.params, trainer.global_step, losses, module.val_losses, module.train_parts,
                            auditor.reports, datamodule.summary(), round(train_seconds(trainer), 2), memory,
                            curve[0].points if curve else None)
    return pruning.pruned, FitResult(module.model, state, record, trainer.is_global_zero,
                                     isinstance(trainer.strategy, ModelParallelStrategy),
                                     isinstance(trainer.strategy, DeepSpeedStrategy))


def _untrained(run: Run, pruning: PruningCallback) -> tuple[PrunedModel, FitResult]:
    """``adapter=none``: prune in this process (no Trainer), attach nothing, audit."""
    pruned = pruning.run_alone(local_device(run.job.trainer.accelerator))
    model, _ = apply_adapter(pruned.model, run.job.adapter, pruned.masks)
    report = audit(model, pruned.masks, pruned.zeros, when="fit_start")
    return pruned, FitResult(model, {}, TrainingRecord(count_parameters(model),
                                                       audits=[{"when": "fit_start", "step": 0, **report}]))
