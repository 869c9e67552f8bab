"""``adapter=masked_full``: masked full fine-tuning (the upper bound): kept weights trained, pruned ones fixed at 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.adapters.base import AdapterMethod, Masks, MergedLayer, linear_tensors
from spp.adapters.bitmask import unpack_rows
from spp.adapters.config import AdapterConfig
from spp.adapters.masked_full import (
    MASK_BUFFER,
    estimate_training_memory,
    inject_masked_full,
    kept_parameters,
    merge_masked_full,
    save_masked_full,
)


class MaskedFull(AdapterMethod):
    """The adapted projections' weights train with gradient ``dL/dW ⊙ M``; merge is the identity.

    Refuses (``MemoryError`` naming ``adapter.name=masked_full``) when gradients + AdamW states do not fit; the
    estimate is :func:`spp.adapters.masked_full.estimate_training_memory`. ``r``, ``scale``, ``dropout`` and the SPP
    keys of the config are not used; the weights train in their own dtype (``adapter.dtype`` does not apply).
    """

    name = "masked_full"

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        return inject_masked_full(model, masks, targets=tuple(cfg.targets))

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        return merge_masked_full(model)

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        save_masked_full(model, directory, extra)

    @torch.no_grad()
    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """A trained layer's own weights (the merge is the identity), with its kept, trained and pruned non-zeros."""
        if not (isinstance(module, nn.Linear) and hasattr(module, MASK_BUFFER)):
            return None
        keep = unpack_rows(getattr(module, MASK_BUFFER), module.in_features).to(module.weight.device)
        stats = {"kept_params": int(keep.sum()), "trainable_params": keep.numel(),
                 "pruned_nonzero": int(((module.weight != 0) & ~keep).sum())}
        return MergedLayer(linear_tensors(module), stats)

    def merge_summary(self, layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """``{"layers", "kept_params", "trainable_params", "pruned_nonzero"}`` as :func:`merge_masked_full` reports."""
        return {"layers": len(layers), **{k: sum(s[k] for s in layers.values())
                                          for k in ("kept_params", "trainable_params", "pruned_nonzero")}}

    def trained_parameters(self, model: nn.Module) -> int:
        """The weights that move (kept entries of the adapted layers); ``count_parameters`` counts whole tensors."""
        return kept_parameters(model)

    def memory_estimate(self, model: nn.Module) -> dict[str, Any]:
        """Weights + gradients + AdamW states + masks of the injected model (for the logs)."""
        return estimate_training_memory(model).to_dict()


METHOD = MaskedFull()
