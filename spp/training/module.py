"""``SPPModule``: the LightningModule that instruction-tunes only the adapter of a pruned causal LM."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from torch import nn
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from spp.adapters import AdapterConfig, apply_adapter, count_parameters

SCHEDULE_FNS = {
    "linear": get_linear_schedule_with_warmup,
    "cosine": get_cosine_schedule_with_warmup,
    "constant": get_constant_schedule_with_warmup,
}


class SPPModule(L.LightningModule):
    """Trains the adapter parameters of ``model`` with AdamW, warm-up then linear/cosine decay.

    The adapter is attached in ``configure_model`` (after ``PruningCallback.setup`` has pruned the weights and
    before the strategy wraps the model), so optimizers are built from the strategy's wrapped parameters.
    Checkpoints hold only the adapter tensors (plus optimizer, scheduler and loop state): frozen pruned
    weights are rebuilt from the pruning cache on resume.

    Args:
        model: A (to-be-)pruned HF causal LM.
        adapter: The ``adapter`` group (mapping or dataclass).
        lr: Peak learning rate.
        weight_decay: AdamW weight decay (authors: 0.001).
        betas: AdamW betas.
        warmup_ratio: Share of the optimisation steps spent warming up linearly (authors: 0.03).
        scheduler: ``linear``, ``cosine`` or ``constant`` after warm-up.
        gradient_checkpointing: Enable HF gradient checkpointing of the decoder layers.
        compile_model: Run the training forward through ``torch.compile`` (validation, merge and export use
            the plain module). Off by default: see ``benchmarks/README.md`` for its measured effect.
    """

    def __init__(
        self,
        model: nn.Module,
        adapter: Mapping[str, Any] | Any,
        lr: float = 4e-3,
        weight_decay: float = 0.001,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_ratio: float = 0.03,
        scheduler: str = "linear",
        gradient_checkpointing: bool = False,
        compile_model: bool = False,
    ) -> None:
        super().__init__()
        if scheduler not in SCHEDULE_FNS:
            raise ValueError(f"trainer.scheduler={scheduler!r}: use one of {sorted(SCHEDULE_FNS)}")
        self.model = model
        self.adapter_cfg = adapter if isinstance(adapter, AdapterConfig) else AdapterConfig(**dict(adapter))
        self.lr, self.weight_decay, self.betas = float(lr), float(weight_decay), tuple(betas)
        self.warmup_ratio, self.scheduler_name = float(warmup_ratio), scheduler
        self.gradient_checkpointing = gradient_checkpointing
        self.compile_model = compile_model
        self._compiled: list[Any] = []  # a list, so nn.Module does not register the compiled view as a child
        self.strict_loading = False
        self.trainable_names: list[str] = []
        self.param_counts: dict[str, int] = {}
        self.train_losses: list[float] = []
        self.val_losses: list[float] = []
        self._injected = False
        self._tick: float | None = None
        self._tokens = 0
        self._val_sum, self._val_count = 0.0, 0
        self._train_start: float | None = None
        self.train_seconds = 0.0
        self.save_hyperparameters(ignore=["model", "adapter"])

    # ----------------------------------------------------------------- model
    def configure_model(self) -> None:
        """Attach the adapter once, freeze everything else, switch gradient checkpointing on if asked."""
        if self._injected:
            return
        self.model, self.trainable_names = apply_adapter(self.model, self.adapter_cfg, {})
        self.param_counts = count_parameters(self.model).to_dict()
        if self.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model.config.use_cache = False
        if self.compile_model:
            # a compiled view of the same module, kept out of the module tree so state_dict keys do not change
            self._compiled.append(torch.compile(self.model))
        self._injected = True

    def on_fit_start(self) -> None:
        """Put the wrapped model in train mode (it is loaded in eval mode; adapter dropout needs train mode)."""
        self.model.train()

    def forward(self, **batch: torch.Tensor) -> Any:
        """Run the wrapped causal LM (HF output with ``.loss`` when ``labels`` are given)."""
        return self.model(**batch, use_cache=False)

    # ----------------------------------------------------------------- steps
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Causal-LM loss on one micro-batch (labels -100 are ignored)."""
        run = self._compiled[0] if self._compiled else self.model
        loss = run(**batch, use_cache=False).loss
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=batch["input_ids"].size(0))
        self._tokens += int(batch["attention_mask"].sum())
        self.train_losses.append(float(loss.detach()))
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Start the tokens/s clock."""
        if self._tick is None:
            self._tick = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log tokens/s over the batches since the last log."""
        elapsed = time.perf_counter() - (self._tick or time.perf_counter())
        if elapsed > 0 and self._tokens:
            self.log("train/tokens_per_s", self._tokens / elapsed, on_step=True, on_epoch=False, prog_bar=True)
        self._tick, self._tokens = time.perf_counter(), 0

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Validation loss, averaged over the epoch and across ranks."""
        loss = self(**batch).loss
        size = batch["input_ids"].size(0)
        self.log("val/loss", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True, batch_size=size)
        self._val_sum += float(loss.detach()) * size
        self._val_count += size
        return loss

    def on_validation_epoch_start(self) -> None:
        """Reset this rank's running validation mean."""
        self._val_sum, self._val_count = 0.0, 0

    def on_validation_epoch_end(self) -> None:
        """Keep the epoch's (this rank's, batch-size weighted) validation loss for the summary."""
        if self._val_count and not self.trainer.sanity_checking:
            self.val_losses.append(self._val_sum / self._val_count)

    def on_train_end(self) -> None:
        """Stop the training clock (``train_seconds`` excludes pruning, evaluation and export)."""
        if self._train_start is not None:
            self.train_seconds += time.perf_counter() - self._train_start
            self._train_start = None

    def on_train_start(self) -> None:
        """Start the training clock and log the trainable / frozen parameter counts once."""
        self._train_start = time.perf_counter()
        counts = {f"params/{k}": float(v) for k, v in self.param_counts.items()}
        for logger in self.loggers:
            logger.log_metrics(counts, step=0)

    # ----------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW over the trainable parameters of the (strategy-wrapped) model, warm-up then decay per step."""
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:
            raise ValueError("no trainable parameters: adapter.name=none cannot be trained (skip training)")
        optimizer = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, betas=self.betas)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = math.ceil(self.warmup_ratio * total)
        fn = SCHEDULE_FNS[self.scheduler_name]
        if self.scheduler_name == "constant":
            schedule = fn(optimizer, num_warmup_steps=warmup)
        else:
            schedule = fn(optimizer, num_warmup_steps=warmup, num_training_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    # ----------------------------------------------------------------- adapter-only checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only the trainable (adapter) tensors in the checkpoint's ``state_dict``."""
        keep = {f"model.{n}" for n in self.trainable_names}
        state = checkpoint.get("state_dict", {})
        checkpoint["state_dict"] = {k: v for k, v in state.items() if k in keep}
        checkpoint["adapter_keys"] = sorted(keep)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Check that an adapter checkpoint holds every adapter tensor of this model (names the missing)."""
        keys = set(checkpoint.get("state_dict", {}))
        missing = sorted({f"model.{n}" for n in self.trainable_names} - keys)
        if self.trainable_names and missing:
            raise ValueError(
                f"checkpoint lacks {len(missing)} adapter tensor(s), e.g. {missing[:3]}; was it written with the "
                "same adapter.* settings (r, targets, use_beta)?"
            )

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The trainable tensors keyed by their names inside the wrapped model."""
        params = dict(self.model.named_parameters())
        return {n: params[n].detach().clone() for n in self.trainable_names}
