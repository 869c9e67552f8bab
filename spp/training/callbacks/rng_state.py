"""``RngState``: the random state (torch CPU and CUDA, numpy, Python) in every checkpoint, for exact resume.

The state after each training batch is restored when the next one starts, so validation and loader seeding
leave adapter dropout's stream untouched; a checkpoint holds one state per rank (another world size is refused).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from spp.distributed import DistContext
from spp.errors import UserError

log = logging.getLogger(__name__)

RNG_KEY = "rng_states"
"""Checkpoint key of the per-rank random states."""


def rng_states() -> dict[str, Any]:
    """The global random states of this process: torch CPU, the current CUDA device (if in use), numpy, Python."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # plain types: checkpoints load with weights_only
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                              "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(gauss))}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` returned (a CUDA state only when this process uses CUDA)."""
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(states["cuda"])


class RngState(Callback):
    """Keep the random stream a function of the training batches, and save / restore it with checkpoints."""

    def __init__(self) -> None:
        self._after_batch: dict[str, Any] | None = None
        self._pending: dict[str, Any] | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        states, self._pending = self._pending or self._after_batch, None
        if states is not None:
            set_rng_states(states)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._after_batch = rng_states()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # the state the next training batch starts from: the one after the last batch, not the current one (an
        # epoch-end checkpoint is written after that epoch's validation, whose loader drew from the generator)
        checkpoint[RNG_KEY] = DistContext.current().gather_objects(self._after_batch or rng_states())  # rank order

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(RNG_KEY)
        if not saved:
            log.warning("the checkpoint holds no random state (written before it was saved): adapter dropout after "
                        "the resume draws other masks than the interrupted run would have")
            return
        if len(saved) != trainer.world_size:
            raise UserError(f"the resumed checkpoint holds the random states of {len(saved)} process(es); this run "
                            f"has {trainer.world_size}: they do not map to another world size",
                            "resume with the checkpoint's trainer.devices x trainer.num_nodes, or start a new run "
                            "without trainer.resume_from", key="trainer.devices")
        self._pending = saved[trainer.global_rank]
