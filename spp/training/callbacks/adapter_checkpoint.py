"""``AdapterCheckpoint``: resumable checkpoints of the adapter tensors only (frozen weights come back from the
pruning cache), and one of the finished step on Ctrl-C; a second Ctrl-C stops at once, without a checkpoint.
"""

from __future__ import annotations

import logging
import re
import shlex
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import ModelCheckpoint

from spp.deepspeed_support import client_state_file

log = logging.getLogger(__name__)


VALIDATION_DUE_KEY = "spp_validation_due"
"""Checkpoint key: whether the validation Lightning runs right after the checkpoint's step had not run yet (a step
checkpoint is written at ``on_train_batch_end``, before it); the resumed run runs it before training continues."""

_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_/.+@%:-]+")
"""A value Hydra's override grammar reads as written (no quoting needed)."""


def hydra_value(value: str) -> str:
    """``value`` as a Hydra override value that composes back to exactly ``value``: as is when plain, else
    single-quoted, with a backslash before a quote, before ``${`` (no interpolation) and doubled where backslashes
    precede either or the closing quote (a space, a non-ASCII letter, ``,`` or ``=`` in a path need it)."""
    if _HYDRA_PLAIN.fullmatch(value):
        return value
    escaped = re.sub(r"\\+(?='|\$\{|$)", lambda m: m.group(0) * 2, value)
    return "'" + escaped.replace("'", "\\'").replace("${", "\\${") + "'"


def resume_command(run_dir: Path, overrides: list[str] | None = None) -> str:
    """``python train.py <this run's overrides> run_dir=<run_dir> trainer.resume_from=last``, quoted for the shell
    and for Hydra (a ``run_dir`` with a space or a non-ASCII letter). ``overrides``: the run's command-line
    overrides (default: Hydra's record of them)."""
    if overrides is None and HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    keep = ["<the overrides of this run>"] if overrides is None else [
        shlex.quote(o) for o in overrides if o.lstrip("+~").split("=", 1)[0] not in ("run_dir", "trainer.resume_from")]
    return " ".join(["python train.py", *keep, shlex.quote(f"run_dir={hydra_value(str(run_dir))}"),
                     "trainer.resume_from=last"])


class AdapterCheckpoint(ModelCheckpoint):
    """A ``ModelCheckpoint`` writing ``adapter-stepNNNNNN.ckpt`` under ``dirpath`` and ``last.ckpt`` as a symbolic
    link to the newest; on Ctrl-C, one of the step just finished (``every_n_train_steps=None``: each epoch end)."""

    def __init__(self, dirpath: str | Path, every_n_train_steps: int | None = None, save_top_k: int = 1) -> None:
        super().__init__(
            dirpath=str(dirpath),
            filename="adapter-step{step:06d}",
            auto_insert_metric_name=False,
            every_n_train_steps=every_n_train_steps,
            save_top_k=save_top_k,
            monitor="step" if save_top_k not in (-1, 0, 1) else None,
            mode="max",
            save_last="link",  # last.ckpt is a link to the newest step file, never a second copy of it
            save_on_train_epoch_end=True,
        )
        self.stop_requested = False
        self._handler_installed = False
        self._is_global_zero = True
        self._previous_handler: Any = None
        self._step_at_batch_start = 0
        self._validation_due = False  # at this batch's end: a validation follows and has not run yet
        self._validate_first = False  # resumed from a checkpoint written before its step's validation

    # ------------------------------------------------------------------ Ctrl-C
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._is_global_zero = trainer.is_global_zero
        if threading.current_thread() is threading.main_thread() and not self._handler_installed:
            self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
            self._handler_installed = True
        if self._validate_first:
            self._validate_first = False
            run_missed_validation(trainer)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """First Ctrl-C: stop after this optimiser step with a checkpoint; the next one interrupts at once."""
        self.stop_requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if self._is_global_zero:
            log.warning("Ctrl-C: finishing this optimiser step, then writing a resumable checkpoint and stopping "
                        "(Ctrl-C again stops at once, without a checkpoint)")

    def _restore_handler(self) -> None:
        if self._handler_installed and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) in (self._on_sigint, signal.default_int_handler):
                signal.signal(signal.SIGINT, self._previous_handler or signal.default_int_handler)
            self._handler_installed = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # Lightning's own rule (its training loop asks it right after this hook); no public API answers it
        self._validation_due = trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.global_step != self._step_at_batch_start and self._stop_everywhere(trainer):
            self.save_and_stop(trainer)  # a finished optimiser step, not the middle of a gradient accumulation

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        self._validation_due = False

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[VALIDATION_DUE_KEY] = self._validation_due

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._validate_first = bool(checkpoint.get(VALIDATION_DUE_KEY, False))

    def _stop_everywhere(self, trainer: L.Trainer) -> bool:
        """Whether any rank got Ctrl-C (one small all-reduce with several ranks, so all stop at the same step)."""
        if trainer.world_size > 1:
            return bool(trainer.strategy.reduce_boolean_decision(self.stop_requested, all=False))
        return self.stop_requested

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._restore_handler()
        if self._stop_everywhere(trainer):  # Ctrl-C during the last validation: stop before finalize all the same
            self.save_and_stop(trainer)

    def save_and_stop(self, trainer: L.Trainer) -> None:
        """Write a checkpoint of the last finished optimiser step (unless one exists), log how to resume, stop."""
        if not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
        self.stop_requested = False
        if trainer.is_global_zero:
            path = Path(self._last_checkpoint_saved or Path(self.dirpath or ".") / "last.ckpt")
            log.warning("interrupted: training stopped after optimiser step %d; resumable checkpoint: %s "
                        "(last.ckpt links to it)", trainer.global_step, path)
            log.warning("resume with: %s", resume_command(Path(self.dirpath or ".").resolve().parent))
        raise KeyboardInterrupt

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self._restore_handler()
        if isinstance(exception, KeyboardInterrupt) and self.stop_requested and trainer.is_global_zero:
            last = self._last_checkpoint_saved
            log.warning("interrupted at once (second Ctrl-C): no checkpoint of the step under way; %s",
                        f"the newest checkpoint is {last}" if last else "no checkpoint was written")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._restore_handler()


def run_missed_validation(trainer: L.Trainer) -> None:
    """Run the validation due after the resumed checkpoint's step, as Lightning's training loop runs one (its loop
    state, restored from the checkpoint, says that validation is done: on restart it goes straight to training)."""
    val_loop = trainer.fit_loop.epoch_loop.val_loop
    val_loop.restarting = False  # a fresh validation, not the continuation of an interrupted one
    trainer.validating = True
    val_loop.run()
    trainer.training = True


def resolve_resume(resume_from: str | None, checkpoint_dir: Path) -> str | None:
    """Turn ``trainer.resume_from`` into a checkpoint path (``last`` = ``<run_dir>/checkpoints/last.ckpt``).

    Under DeepSpeed a checkpoint is a directory of that name in DeepSpeed's layout (``spp.deepspeed_support``).
    """
    if not resume_from:
        return None
    path = checkpoint_dir / "last.ckpt" if resume_from == "last" else Path(resume_from).expanduser()
    outer = _inside_deepspeed_checkpoint(path)
    if (path.is_file() and outer is None) or client_state_file(path) is not None:
        return str(path)
    key = f"trainer.resume_from={resume_from!r}"
    if outer is not None:
        raise FileNotFoundError(f"{key}: {path} is inside the DeepSpeed checkpoint {outer}; give "
                                f"trainer.resume_from={outer}")
    if path.is_dir():
        raise FileNotFoundError(f"{key}: {path} is a directory but not a DeepSpeed checkpoint (no latest file and "
                                "<tag>/*model_states.pt); give a checkpoint written by a run "
                                "(<run_dir>/checkpoints/*.ckpt)")
    raise FileNotFoundError(
        f"{key}: no checkpoint at {path}; give a .ckpt path written by a run (<run_dir>/checkpoints/*.ckpt)"
    )


def _inside_deepspeed_checkpoint(path: Path) -> Path | None:
    """The DeepSpeed checkpoint directory that ``path`` (its tag directory, or a file in it) lies inside."""
    for outer in (path.parent, path.parent.parent):
        if outer != path and client_state_file(outer) is not None:
            return outer
    return None
