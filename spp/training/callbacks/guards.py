"""Run guards: stop training at the first non-finite loss or gradient norm, or when the loss has blown up far above
its starting value for several steps, naming the step and learning rate; and stamp every checkpoint with the
settings it was written with (checked by ``spp.training.resume_checks.check_resume``)."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from spp.errors import DivergedError
from spp.training.config import GuardsConfig


def _lr_text(trainer: L.Trainer) -> str:
    """`` (learning rate 0.004)``, or nothing when no optimizer holds one yet."""
    try:
        return f" (learning rate {float(trainer.optimizers[0].param_groups[0]['lr']):g})"
    except (IndexError, KeyError, AttributeError):
        return ""


class GuardsCallback(Callback):
    """Raise :class:`spp.errors.DivergedError` at the first non-finite training loss or gradient norm, or when the
    training loss has blown up (``guards.loss_blowup_*``).

    The gradient norm is read after the cross-rank reduction, and the blow-up check uses the step's rank-averaged
    loss, so every rank stops at the same step; fp16 skips the gradient check (its loss scaler skips overflows).
    """

    def __init__(self, settings: dict[str, Any] | None = None, guards: GuardsConfig | None = None) -> None:
        self.settings = settings or {}
        self.guards = guards or GuardsConfig()
        self.first_loss: float | None = None
        self.steps_above = 0
        self._step_losses: list[torch.Tensor] = []
        self._step_at_batch_start = 0

    def _stop(self, trainer: L.Trainer, what: str, value: float | str) -> None:
        raise DivergedError(
            f"training stopped: {what} is {value} at step {trainer.global_step}{_lr_text(trainer)}",
            "lower trainer.lr (or set trainer.gradient_clip_val); the checkpoints written so far are kept",
            key="trainer.lr",
        )

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and trainer.world_size == 1:
            value = float(loss.detach().float())
            if not math.isfinite(value):
                self._stop(trainer, "the training loss", value)
        if not (self.guards.enabled and self.guards.loss_blowup_steps > 0):
            return
        if isinstance(loss, torch.Tensor):
            self._step_losses.append(loss.detach().float())
        if trainer.global_step != self._step_at_batch_start and self._step_losses:  # an optimiser step just ended
            mean = torch.stack(self._step_losses).mean()
            self._step_losses = []
            if trainer.world_size > 1:
                mean = trainer.strategy.reduce(mean, reduce_op="mean")
            self.check_blowup(trainer, float(mean))

    def check_blowup(self, trainer: L.Trainer, loss: float) -> None:
        """Count the optimiser steps in a row whose loss is above the bound; stop the run at ``loss_blowup_steps``."""
        if self.first_loss is None:
            self.first_loss = loss if math.isfinite(loss) else None
            return
        g = self.guards
        bound = max(g.loss_blowup_factor * self.first_loss, self.first_loss + g.loss_blowup_margin)
        self.steps_above = self.steps_above + 1 if not loss <= bound else 0
        if self.steps_above < g.loss_blowup_steps:
            return
        raise DivergedError(
            f"training stopped: the training loss blew up: {loss:.4g} at step {trainer.global_step}"
            f"{_lr_text(trainer)}, above {bound:.4g} "
            f"(guards.loss_blowup_factor={g.loss_blowup_factor:g} x the first step's {self.first_loss:.4g}, and "
            f"more than guards.loss_blowup_margin={g.loss_blowup_margin:g} above it) for {self.steps_above} "
            "consecutive optimiser steps",
            "lower trainer.lr (e.g. 10 times), or set trainer.gradient_clip_val; guards.loss_blowup_steps=0 turns "
            "this stop off; the checkpoints written so far are kept",
            key="trainer.lr",
        )

    def state_dict(self) -> dict[str, Any]:
        return {"first_loss": self.first_loss, "steps_above": self.steps_above}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first_loss = state_dict.get("first_loss")
        self.steps_above = int(state_dict.get("steps_above", 0))

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if "16-mixed" in str(trainer.precision) and "bf16" not in str(trainer.precision):
            return
        grads = [(g.to_local() if hasattr(g, "to_local") else g).detach().float()  # a DTensor: this rank's shard
                 for g in (p.grad for p in pl_module.parameters()) if g is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) \
            if grads else 0.0
        finite = math.isfinite(norm)
        if trainer.world_size > 1:  # a sharded (FSDP2) gradient's NaN is one rank's: every rank stops at this step
            finite = trainer.strategy.reduce_boolean_decision(finite, all=True)
        if not finite:
            self._stop(trainer, "the gradient norm" if not math.isfinite(norm) else "another rank's gradient norm",
                       norm if not math.isfinite(norm) else "not finite")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.settings:
            checkpoint["spp_settings"] = self.settings
