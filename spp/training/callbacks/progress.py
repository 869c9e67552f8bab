"""Training progress: ``LogProgress`` (periodic log lines, for stdout that is a file or a pipe) and terminal bars
whose total is the real number of batches (``StepBoundedRichBar``, ``StepBoundedTQDMBar``).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger(__name__)


def _clock(seconds: float) -> str:
    """``75.2`` → ``1m15s``; ``3720`` → ``1h02m``."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class LogProgress(Callback):
    """Log ``step i/N, loss, tokens/s, elapsed, ETA`` every ``every_s`` seconds (and at the first and last
    optimiser steps) on global rank 0."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self.lines: list[str] = []
        self._start = self._last = 0.0
        self._tokens = 0
        self._losses: list[float] = []
        self._logged_step = -1
        self._start_step = 0  # the step training (re)started at: a resume's ETA counts only the steps since

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._last = time.perf_counter()
        self._start_step = trainer.global_step
        self._tokens = 0
        self._losses = []
        total = trainer.estimated_stepping_batches
        self._emit(f"training: {total if math.isfinite(total) else '?'} optimiser steps, "
                   f"{trainer.max_epochs} epoch(s), progress every {self.every_s:g} s")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        mask = batch.get("attention_mask") if isinstance(batch, dict) else None
        self._tokens += int(mask.sum()) if mask is not None else 0
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._losses.append(float(loss.detach()))
        step = trainer.global_step
        if step == self._logged_step or step == 0:
            return
        now = time.perf_counter()
        total = trainer.estimated_stepping_batches
        last = math.isfinite(total) and step >= total
        if step == 1 or last or now - self._last >= self.every_s:
            self._line(step, total, now)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != self._logged_step and trainer.global_step > 0:
            self._line(trainer.global_step, trainer.estimated_stepping_batches, time.perf_counter())

    def _line(self, step: int, total: float, now: float) -> None:
        elapsed = now - self._start
        rate = self._tokens / elapsed if elapsed > 0 else 0.0
        loss = sum(self._losses) / len(self._losses) if self._losses else float("nan")
        done = step - self._start_step
        eta = (total - step) * elapsed / done if math.isfinite(total) and done > 0 else float("inf")
        of = f"/{int(total)}" if math.isfinite(total) else ""
        pct = f" ({step / total:.0%})" if math.isfinite(total) and total else ""
        self._emit(f"step {step}{of}{pct}  loss {loss:.4f}  {rate:,.0f} tokens/s  elapsed {_clock(elapsed)}  "
                   f"ETA {_clock(eta)}")
        self._losses = []
        self._last = now
        self._logged_step = step

    @rank_zero_only
    def _emit(self, line: str) -> None:
        self.lines.append(line)
        log.info(line)


class StepBoundedTotal:
    """A Lightning progress bar's epoch total bounded by ``max_steps``: the batches this epoch will really run.

    Lightning's own bar bounds it only with ``max_epochs=-1`` and no gradient accumulation."""

    trainer: L.Trainer
    _epoch_total: float | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_total = bounded_batches(trainer)
        super().on_train_epoch_start(trainer, pl_module)  # type: ignore[misc]

    @property
    def total_train_batches(self) -> int | float:
        return self._epoch_total if self._epoch_total is not None else bounded_batches(self.trainer)


def bounded_batches(trainer: L.Trainer) -> int | float:
    """The batches the current epoch runs: the loader's length, or fewer when ``max_steps`` stops the run first."""
    total = trainer.num_training_batches
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return min(total, (trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches)
    return total


class StepBoundedRichBar(StepBoundedTotal, RichProgressBar):
    """Lightning's Rich bar with the total :class:`StepBoundedTotal` computes."""


class StepBoundedTQDMBar(StepBoundedTotal, TQDMProgressBar):
    """Lightning's tqdm bar with the total :class:`StepBoundedTotal` computes."""
