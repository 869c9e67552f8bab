"""``adapter=sparse_lora``: SparsePEFT (SQFT): LoRA whose update ``s·(B A) ⊙ M`` is masked in training and merge."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.adapters.base import DTYPES, AdapterMethod, ExternalParameters, Masks, MergedLayer, linear_tensors
from spp.adapters.config import AdapterConfig
from spp.adapters.sparse_lora import (
    SparseLoraLinear,
    external_parameters,
    inject_sparse_lora,
    merge_sparse_lora,
    save_sparse_lora,
)


class SparseLoRA(AdapterMethod):
    """peft LoRA (r, lora_alpha, dropout, targets as ``adapter=lora``) with the masked variant; zeros kept exactly."""

    name = "sparse_lora"

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        return inject_sparse_lora(model, masks, targets=tuple(cfg.targets), r=cfg.r, alpha=cfg.lora_alpha,
                                  dropout=cfg.dropout, dtype=DTYPES[str(cfg.dtype)])

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        return merge_sparse_lora(model)

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        save_sparse_lora(model, directory, extra)

    def external_parameters(self, model: nn.Module) -> ExternalParameters:
        """The masked branch reads ``lora_A`` / ``lora_B`` weights without calling those modules."""
        return external_parameters(model)

    @torch.no_grad()
    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """A SparsePEFT layer merged by its own variant (on a copy): ``W~ + s·(B A) ⊙ M``."""
        if not isinstance(module, SparseLoraLinear):
            return None
        delta_sq = sum(float(module.get_delta_weight(a).detach().double().square().sum())
                       for a in module.active_adapters if a in module.lora_A)
        keep = module.mask
        layer = copy.deepcopy(module)
        layer.merge()
        tensors = linear_tensors(layer.get_base_layer())
        pruned_nonzero = int(((tensors["weight"] != 0) & ~keep.to(tensors["weight"].device)).sum())
        return MergedLayer(tensors, {"delta_sq_norm": delta_sq, "pruned_nonzero": pruned_nonzero})

    def merge_summary(self, layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """``{"layers", "delta_sq_norm", "pruned_nonzero"}`` as :func:`merge_sparse_lora` reports."""
        return {"layers": len(layers), "delta_sq_norm": sum(s["delta_sq_norm"] for s in layers.values()),
                "pruned_nonzero": sum(s["pruned_nonzero"] for s in layers.values())}


METHOD = SparseLoRA()
