"""``SPPModule``: the LightningModule that instruction-tunes the adapter of an (already adapted) pruned causal LM."""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from transformers import get_scheduler

from spp.adapters.base import AdapterMethod, Masks, ParamCounts, count_parameters
from spp.adapters.config import AdapterConfig
from spp.adapters.registry import apply_adapter
from spp.distributed import DistContext
from spp.training.config import StrategyConfig, TrainerConfig
from spp.training.objectives import Objective, build_objective
from spp.training.strategies import has_meta_parameters, replicate_from_rank0, shard_from_rank0, shard_model
from spp.training.teacher import match_dtype, place_teacher

log = logging.getLogger(__name__)

VAL_PPL_KEY = "val/ppl"
LOSSES_KEY = "spp_losses"
"""Checkpoint key of the losses so far (training per micro-batch, its parts, validation), for the report of a
resumed run."""


class SPPModule(L.LightningModule):
    """Trains the parameters of ``model`` that require grad with AdamW, warm-up then linear/cosine decay.

    With ``adapter`` the module starts without a model: the
    :class:`~spp.training.callbacks.pruning.PruningCallback` puts the pruned model there in ``setup``, and
    ``configure_model`` attaches the adapter (seeded with ``seed``) and gives every rank its FSDP2 shards or DDP
    replica from rank 0. Checkpoints hold only the trainable tensors; validation stays the labels' cross-entropy
    whatever the ``objective`` (a teacher, if it needs one, comes through :meth:`set_teacher`).
    """

    def __init__(
        self,
        model: nn.Module | None,
        trainer_cfg: TrainerConfig,
        strategy_cfg: StrategyConfig | None = None,
        decoder_layer_cls: type[nn.Module] | None = None,
        adapter: AdapterConfig | None = None,
        seed: int = 0,
        objective: Objective | None = None,
        method: AdapterMethod | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.cfg = trainer_cfg
        self.strategy_cfg = strategy_cfg or StrategyConfig()
        self.decoder_layer_cls = decoder_layer_cls
        self.adapter_cfg = adapter
        self.seed = seed
        self.masks: Masks = {}
        self.params: ParamCounts | None = None
        self.trainable_names = [] if model is None else [n for n, p in model.named_parameters() if p.requires_grad]
        self._compiled: list[Any] = []  # a list, so nn.Module does not register the compiled view as a child
        self.objective = objective if objective is not None else build_objective(None, decoder_layer_cls)
        self.method = method
        self._teacher: list[nn.Module] = []  # a list too: no strategy wraps, casts or checkpoints the teacher
        self._configured = False
        self._losses: list[torch.Tensor] = []
        self._parts: dict[str, list[torch.Tensor]] = {}
        self._resumed: dict[str, Any] = {"train": [], "parts": {}}  # the losses before a resume (its checkpoint's)
        self.val_losses: list[float] = []
        self.strict_loading = False

    # ----------------------------------------------------------------- model
    def configure_model(self) -> None:
        """The adapter (with ``adapter``), gradient checkpointing, every rank's part of the model (FSDP2 shards
        or a DDP replica from rank 0) and ``torch.compile`` if asked."""
        if self._configured:
            return
        if self.adapter_cfg is not None:
            self._attach_adapter()
        if self.cfg.gradient_checkpointing or self.strategy_cfg.activation_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model.config.use_cache = False
        strategy = self._trainer.strategy if self._trainer is not None else None
        ctx = DistContext.current(strategy.root_device if strategy is not None else None)
        from_rank0 = ctx.distributed and ctx.gather_objects(has_meta_parameters(self.model)) != [False] * ctx.world
        mesh = self.device_mesh["data_parallel"] if isinstance(strategy, ModelParallelStrategy) else None
        if mesh is not None:
            if from_rank0:
                shard_from_rank0(self.model, mesh, self.decoder_layer_cls, ctx, self.strategy_cfg.reshard_after_forward)
            else:
                shard_model(self.model, mesh, self.decoder_layer_cls, self.strategy_cfg.reshard_after_forward)
        else:
            if from_rank0:
                replicate_from_rank0(self.model, ctx, strategy)
            self._after_placement()  # masked_full: the mask hook on the weight objects now trained
        if self._teacher:
            place_teacher(self._teacher[0], ctx, from_rank0, mesh, self.decoder_layer_cls)
        if self.cfg.compile:
            # a compiled view of the same module, kept out of the module tree so state_dict keys do not change
            self._compiled.append(torch.compile(self.model))
        self._configured = True

    def _attach_adapter(self) -> None:
        """Inject ``adapter`` into the pruned model (the same seeded initialisation on every rank; rank 0's values
        are the ones every rank ends with) and record what it trains."""
        if self.model is None:
            raise RuntimeError("SPPModule(adapter=...) needs the PruningCallback among the Trainer's callbacks")
        L.seed_everything(self.seed, workers=True, verbose=False)
        self.model, self.trainable_names = apply_adapter(self.model, self.adapter_cfg, self.masks)
        self.params = count_parameters(self.model)
        if self.global_rank == 0:
            log.info("fit phase: adapter %s r=%s, %s trainable of %s parameters", self.adapter_cfg.name,
                     getattr(self.adapter_cfg, "r", "-"), f"{self.params.trainable:,}", f"{self.params.total:,}")

    def set_teacher(self, teacher: nn.Module) -> None:
        """Keep ``teacher`` (the frozen dense model, rank 0's weights or a skeleton) for the objective."""
        self._teacher[:] = [teacher]

    @property
    def teacher(self) -> nn.Module | None:
        """The placed dense teacher while training (``None`` without one, or after ``fit`` ends)."""
        return self._teacher[0] if self._teacher else None

    def on_fit_start(self) -> None:
        """Put the wrapped model in train mode (it is loaded in eval mode; adapter dropout needs train mode) and
        log the parameter counts."""
        self.model.train()
        if self._teacher:
            match_dtype(self._teacher[0], self.model)
        if self.params is not None:
            for logger in self.loggers:
                logger.log_metrics({f"params/{k}": float(v) for k, v in self.params.to_dict().items()}, step=0)

    def on_fit_end(self) -> None:
        """Drop the teacher: its memory is free for the export and evaluation."""
        self._teacher.clear()

    def forward(self, **batch: torch.Tensor) -> Any:
        """Run the wrapped causal LM (HF output with ``.loss`` when ``labels`` are given)."""
        return self.model(**batch, use_cache=False)

    # ----------------------------------------------------------------- steps
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The objective's loss on one micro-batch (``train/loss``; its parts as ``train/<part>``, e.g. the
        cross-entropy ``train/ce`` under distillation); no host sync here."""
        run = self._compiled[0] if self._compiled else self.model
        out = self.objective.loss(run, batch, self.teacher)
        size = batch["input_ids"].size(0)
        self.log("train/loss", out.loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=size)
        for name, value in out.parts.items():
            self.log(f"train/{name}", value, on_step=True, on_epoch=False, batch_size=size)
            self._parts.setdefault(name, []).append(value)
        self._losses.append(out.loss.detach())
        return out.loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Validation loss, averaged over the epoch and across ranks by Lightning (``sync_dist``)."""
        loss = self(**batch).loss
        self.log("val/loss", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True,
                 batch_size=batch["input_ids"].size(0))
        return loss

    def on_validation_end(self) -> None:
        """Keep the epoch's synced ``val/loss`` (the value every logger received) for the summary, and log
        ``val/ppl = exp(val/loss)`` (the validation split's perplexity) to every logger at this optimiser step."""
        value = self.trainer.callback_metrics.get("val/loss")
        if value is None or self.trainer.sanity_checking:
            return
        self.val_losses.append(float(value))
        ppl = math.exp(float(value)) if float(value) < 700 else math.inf  # exp overflows a float above ~709
        for logger in self.loggers:
            logger.log_metrics({VAL_PPL_KEY: ppl}, step=self.trainer.global_step)

    @property
    def train_losses(self) -> list[float]:
        """Per-micro-batch training losses of the whole run, those before a resume included (one host transfer)."""
        return self._resumed["train"] + (torch.stack(self._losses).float().cpu().tolist() if self._losses else [])

    @property
    def train_parts(self) -> dict[str, list[float]]:
        """Per-micro-batch parts of the objective's loss (``ce``, ``kl``, ...; empty under ``objective=ce``)."""
        return {k: self._resumed["parts"].get(k, []) + torch.stack(v).float().cpu().tolist()
                for k, v in self._parts.items()}

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        """Each method's hook before clipping and the step (masked full fine-tuning zeroes the pruned entries of the
        possibly sharded gradients: :meth:`~spp.adapters.base.AdapterMethod.before_optimizer_step`)."""
        if self.method is not None:
            self.method.before_optimizer_step(self.model)

    def _after_placement(self) -> None:
        """The adapter method's hook once the model is placed (none for a caller-built model without ``method``)."""
        if self.method is not None:
            self.method.after_placement(self.model)

    # ----------------------------------------------------------------- optimisation
    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW over the trainable parameters of the (possibly sharded) model; warm-up then decay per step."""
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:
            raise ValueError("no trainable parameters: adapter.name=none has no training loop")
        cfg = self.cfg
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        schedule = get_scheduler(cfg.scheduler.hf_name, optimizer, num_warmup_steps=math.ceil(cfg.warmup_ratio * total),
                                 num_training_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    # ----------------------------------------------------------------- adapter-only checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only the trainable (adapter) tensors in the checkpoint's ``state_dict``."""
        keep = {f"model.{n}" for n in self.trainable_names}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint.get("state_dict", {}).items() if k in keep}
        checkpoint["adapter_keys"] = sorted(keep)
        checkpoint[LOSSES_KEY] = {"train": self.train_losses, "parts": self.train_parts, "val": list(self.val_losses)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Check that an adapter checkpoint holds every adapter tensor of this model (names the missing); a
        DeepSpeed checkpoint has no ``state_dict``, so its recorded ``adapter_keys`` say what it holds."""
        saved = checkpoint.get("state_dict")
        keys = set(saved if saved is not None else checkpoint.get("adapter_keys", []))
        losses = checkpoint.get(LOSSES_KEY, {})  # a checkpoint older than the record: the report starts at the resume
        self._resumed = {"train": list(losses.get("train", [])), "parts": dict(losses.get("parts", {}))}
        self.val_losses[:] = list(losses.get("val", []))
        missing = sorted({f"model.{n}" for n in self.trainable_names} - keys)
        if self.trainable_names and missing:
            raise ValueError(
                f"checkpoint lacks {len(missing)} adapter tensor(s), e.g. {missing[:3]}; was it written with the "
                "same adapter.* settings (r, targets, use_beta)?"
            )
