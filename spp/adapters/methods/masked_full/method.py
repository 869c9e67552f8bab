"""``adapter=masked_full``: masked full fine-tuning (the upper bound): kept weights trained, pruned ones fixed at 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.adapters.base import AdapterMethod, Masks, MergedLayer, linear_tensors
from spp.adapters.config import AdapterConfig
from spp.adapters.methods.masked_full.config import MaskedFullConfig
from spp.adapters.methods.masked_full.masked_full import (
    MASK_BUFFER,
    inject_masked_full,
    kept_parameters,
    layer_stats,
    mask_gradients,
    merge_masked_full,
    restore_gradient_hooks,
    save_masked_full,
)
from spp.errors import UserError


class MaskedFull(AdapterMethod):
    """The adapted projections' weights train with gradient ``dL/dW ⊙ M``; merge is the identity.

    Refuses (``MemoryError``) when gradients + AdamW states do not fit; ``adapter.dtype`` does not apply.
    """

    name = "masked_full"
    reconstruct_lr = 3e-3  # chosen on validation PPL, SmolLM2-135M Wanda 2:4 (reconstruction_smollm2_135m.md)
    config_class = MaskedFullConfig
    summed_stats = ("kept_params", "trainable_params", "pruned_nonzero")  # as merge_masked_full reports

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        return inject_masked_full(model, masks, targets=tuple(cfg.targets))

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        return merge_masked_full(model)

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        save_masked_full(model, directory, extra)

    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """Refused: the trained weights are the model itself (``<run_dir>/merged``), not adapter tensors."""
        raise UserError(f"adapter_dir={str(directory)!r} holds a masked full fine-tuning run, whose trained weights "
                        "are the whole adapted projections: they are written as the merged model, not as adapter "
                        "tensors", "evaluate that run's merged model with model.path=<run_dir>/merged (no "
                        "adapter_dir=)", key="adapter_dir", path=directory)

    @torch.no_grad()
    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """A trained layer's own weights (the merge is the identity), with its kept, trained and pruned non-zeros."""
        if not (isinstance(module, nn.Linear) and hasattr(module, MASK_BUFFER)):
            return None
        return MergedLayer(linear_tensors(module), layer_stats(module))

    def resident_terms(self, adapted_weights: int) -> dict[str, int]:
        """Each adapted layer's packed mask (a bit per weight) on every device."""
        return {"mask_buffers": adapted_weights // 8}

    def train_flops(self, adapted_weights: int, trainable: int, dropout: float) -> int:
        """The weight gradients of the adapted linears (``2 N_a``)."""
        return 2 * adapted_weights

    def trained_parameters(self, model: nn.Module, sparsity: float | None = None) -> int:
        """The kept entries of the adapted layers (``1 - sparsity`` of each when given, for a model on ``meta``)."""
        if sparsity is None:
            return kept_parameters(model)
        return sum(round(p.numel() * (1.0 - sparsity)) for p in model.parameters() if p.requires_grad)

    def after_placement(self, model: nn.Module) -> None:
        """The gradient-mask hook back on the weight objects placement made (:func:`restore_gradient_hooks`)."""
        restore_gradient_hooks(model)

    def before_optimizer_step(self, model: nn.Module) -> None:
        """``dL/dW ⊙ M`` wherever the gradient lives now (:func:`mask_gradients`: FSDP2 shards, DDP replicas)."""
        mask_gradients(model)


METHOD = MaskedFull()
