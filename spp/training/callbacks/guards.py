"""Run guards: stop training at the first non-finite loss or gradient norm, naming the step and learning rate, and
stamp every checkpoint with the settings it was written with (checked by ``spp.preflight.check_resume``)."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from spp.errors import DivergedError


def _lr(trainer: L.Trainer) -> float | None:
    try:
        return float(trainer.optimizers[0].param_groups[0]["lr"])
    except (IndexError, KeyError, AttributeError):
        return None


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class GuardsCallback(Callback):
    """Raise :class:`spp.errors.DivergedError` at the first non-finite training loss or gradient norm.

    The gradient norm is read after the gradients are reduced across ranks (``on_before_optimizer_step``), so every
    rank sees the same non-finite value and stops together; the per-micro-batch loss is checked in a single process
    only (with several ranks a local check could leave the others waiting in a collective). fp16 mixed precision
    skips the gradient check: its loss scaler expects and skips overflowing steps itself.

    Args:
        settings: Stored as ``checkpoint["spp_settings"]`` (``spp.preflight.settings_of``).
    """

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        self.settings = settings or {}

    def _stop(self, trainer: L.Trainer, what: str, value: float) -> None:
        lr = _lr(trainer)
        raise DivergedError(
            f"training stopped: {what} is {value} at step {trainer.global_step} (learning rate {lr:g})"
            if lr is not None else f"training stopped: {what} is {value} at step {trainer.global_step}",
            "lower trainer.lr (or set trainer.gradient_clip_val); the checkpoints written so far are kept",
            key="trainer.lr",
        )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.world_size > 1:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            value = float(loss.detach().float())
            if not math.isfinite(value):
                self._stop(trainer, "the training loss", value)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if "16-mixed" in str(trainer.precision) and "bf16" not in str(trainer.precision):
            return
        grads = [_local(p.grad).detach().float() for p in pl_module.parameters() if p.grad is not None]
        if not grads:
            return
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        if not math.isfinite(norm):
            self._stop(trainer, "the gradient norm", norm)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.settings:
            checkpoint["spp_settings"] = self.settings
