"""The Lightning ``Trainer`` of a job: strategy, precision, accumulation and the callbacks of the training loop."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import (
    Callback,
    LearningRateMonitor,
    ThroughputMonitor,
    Timer,
)
from lightning.pytorch.loggers import Logger

from spp.training.callbacks.adapter_checkpoint import AdapterCheckpoint
from spp.training.callbacks.progress import LogProgress, StepBoundedRichBar, StepBoundedTQDMBar
from spp.training.callbacks.rng_state import RngState
from spp.training.config import ProgressBar, TrainerConfig, TrainJobConfig
from spp.training.resume_checks import world_of
from spp.training.strategies import build_strategy

THROUGHPUT_KEY = "train/device/items_per_sec"
"""The metric Lightning's ``ThroughputMonitor`` logs for unpadded training tokens per second on one device."""


def resolve_precision(precision: str, accelerator: str) -> str:
    """``auto`` → ``bf16-mixed`` on a CUDA GPU with bf16 support, else ``32-true`` (CPU)."""
    if precision != "auto":
        return precision
    on_gpu = accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
    return "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"


def accumulation(job: TrainJobConfig) -> int:
    """Gradient-accumulation steps: ``global_batch_size / (per-device batch × world size)``.

    Raises:
        ValueError: the global batch is not a multiple of per-device batch × world size (names the keys).
    """
    tcfg = job.trainer
    if tcfg.global_batch_size is None:
        return tcfg.accumulate_grad_batches
    per_step = job.data.train_batch_size * world_of(job)["world_size"]
    if tcfg.global_batch_size % per_step:
        raise ValueError(
            f"trainer.global_batch_size={tcfg.global_batch_size} is not a multiple of data.train_batch_size "
            f"({job.data.train_batch_size}) × world size ({per_step // job.data.train_batch_size})"
        )
    return tcfg.global_batch_size // per_step


def loop_callbacks(tcfg: TrainerConfig, run_dir: Path) -> list[Callback]:
    """What runs during training: adapter checkpoints (with the random state), learning rate, throughput, clock and
    progress."""
    callbacks: list[Callback] = [
        AdapterCheckpoint(run_dir / "checkpoints", tcfg.checkpoint_every_n_steps, tcfg.save_top_k),
        RngState(),
        LearningRateMonitor("step"),
        ThroughputMonitor(batch_size_fn=lambda b: b["input_ids"].size(0),
                          length_fn=lambda b: int(b["attention_mask"].sum()),
                          window_size=max(2, min(20, tcfg.max_steps))),
        Timer(),
    ]
    bar = progress_mode(tcfg.progress_bar)
    if bar is ProgressBar.rich:
        callbacks.append(StepBoundedRichBar(leave=True))
    elif bar is ProgressBar.tqdm:
        callbacks.append(StepBoundedTQDMBar())
    elif bar is ProgressBar.log:
        callbacks.append(LogProgress(tcfg.progress_every_s))
    return callbacks


BARS = (ProgressBar.rich, ProgressBar.tqdm)


def progress_mode(requested: ProgressBar) -> ProgressBar:
    """The display actually used: a bar only on a terminal; ``log`` lines when stdout is a file or a pipe."""
    return ProgressBar.log if requested in BARS and not sys.stdout.isatty() else requested


def shows_bar(requested: ProgressBar) -> bool:
    """Whether a terminal bar (Rich or tqdm) is drawn for ``trainer.progress_bar=requested``."""
    return progress_mode(requested) in BARS


def build_trainer(job: TrainJobConfig, run_dir: Path, loggers: list[Logger], callbacks: list[Callback]) -> L.Trainer:
    """A ``Trainer`` for ``job`` writing under ``run_dir`` (``callbacks`` come after the loop's own)."""
    tcfg = job.trainer
    return L.Trainer(
        accelerator=tcfg.accelerator,
        devices=tcfg.devices,
        num_nodes=tcfg.num_nodes,
        strategy=build_strategy(job.strategy, tcfg.accelerator, world_of(job)["world_size"]),
        precision=resolve_precision(tcfg.precision, tcfg.accelerator),
        max_epochs=tcfg.max_epochs,
        max_steps=tcfg.max_steps,
        accumulate_grad_batches=accumulation(job),
        gradient_clip_val=tcfg.gradient_clip_val,
        val_check_interval=tcfg.val_check_interval,
        limit_val_batches=tcfg.limit_val_batches,
        num_sanity_val_steps=tcfg.num_sanity_val_steps,
        log_every_n_steps=tcfg.log_every_n_steps,
        deterministic=tcfg.deterministic,
        enable_progress_bar=shows_bar(tcfg.progress_bar),
        enable_model_summary=False,
        callbacks=[*loop_callbacks(tcfg, run_dir), *callbacks],
        logger=loggers,
        default_root_dir=str(run_dir),
    )


def train_seconds(trainer: L.Trainer) -> float:
    """Seconds spent in the training loop (Lightning's ``Timer``; validation inside it included)."""
    timer: Any = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    return float(timer.time_elapsed("train")) if timer is not None else 0.0


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory of this process so far: CUDA's max allocated on a GPU, else the process's max RSS (MiB)."""
    if device.type == "cuda":
        return {"peak_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1), "kind": "cuda max allocated"}
    import resource  # POSIX only; Linux reports KiB

    return {"peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "kind": "process max RSS (load, pruning and training included)"}
