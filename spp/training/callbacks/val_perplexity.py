"""``val/ppl``: the validation split's perplexity, exp of the epoch's mean token loss, next to ``val/loss``."""

from __future__ import annotations

import math

import lightning as L
from lightning.pytorch.callbacks import Callback

VAL_PPL_KEY = "val/ppl"


class ValidationPerplexity(Callback):
    """After each validation (sanity checks excluded), log ``val/ppl = exp(val/loss)`` to every logger at the
    current optimiser step, so W&B charts the validation perplexity over steps beside ``train/loss``."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log ``val/ppl`` from the epoch's synced ``val/loss`` (the value the loggers received)."""
        loss = trainer.callback_metrics.get("val/loss")
        if loss is None or trainer.sanity_checking:
            return
        value = float(loss)
        ppl = math.exp(value) if value < 700 else math.inf  # exp overflows a float above ~709
        for logger in trainer.loggers:
            logger.log_metrics({VAL_PPL_KEY: ppl}, step=trainer.global_step)
