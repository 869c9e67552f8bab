"""One rank of a 2-process DDP fit (started by ``tests/test_guards.py`` through ``python -m torch.distributed.run``,
gloo) in which rank 1 alone finds a NaN in its gradient at step 1, as a sharded (FSDP2) gradient's NaN is one rank's.

Usage: ``guard_rank_script.py OUT_PREFIX``; writes ``OUT_PREFIX.rank<r>.json`` holding the step and message with which
this rank stopped (``null`` when it ran to the end)."""

from __future__ import annotations

import json
import sys
from typing import Any

import lightning as L
import torch
from test_guards import Regression
from torch.utils.data import DataLoader, TensorDataset

from spp.errors import DivergedError
from spp.training.callbacks.guards import GuardsCallback
from spp.training.config import GuardsConfig


class PoisonRankOne(L.Callback):
    """After DDP's all-reduce, rank 1's copy of one gradient element becomes NaN at step 1 (its shard alone)."""

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if trainer.global_rank == 1 and trainer.global_step == 1:
            pl_module.linear.weight.grad[0, 0] = float("nan")


generator = torch.Generator().manual_seed(0)
x = torch.randn(64, 8, generator=generator)
data = DataLoader(TensorDataset(x, x @ torch.randn(8, 1, generator=generator)), batch_size=4)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=6, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[PoisonRankOne(), GuardsCallback(guards=GuardsConfig())])
stopped = None
try:
    trainer.fit(Regression(0.01), data)
except DivergedError as err:
    stopped = {"step": trainer.global_step, "message": str(err).splitlines()[0]}
with open(f"{sys.argv[1]}.rank{trainer.global_rank}.json", "w") as f:
    json.dump(stopped, f)
sys.exit(1 if stopped else 0)
