"""``adapter=lora``: the paper's LoRA* baseline (Table 4): peft LoRA, merged, then re-masked with the pruning masks."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from peft.tuners.lora import LoraLayer
from torch import nn

from spp.adapters.base import AdapterMethod, Masks, MergedLayer, linear_tensors
from spp.adapters.config import AdapterConfig
from spp.adapters.lora_star import LayerRemaskStats, RemaskStats, inject_lora, merge_and_remask


class LoRAStar(AdapterMethod):
    """LoRA (dense ``W~ + s·B A`` after merge) followed by ``⊙ M``: what re-masking removes is reported."""

    name = "lora"
    kept_zeros_may_change = True

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        return inject_lora(model, tuple(cfg.targets), r=cfg.r, alpha=cfg.lora_alpha, dropout=cfg.dropout)

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        merged, stats = merge_and_remask(model, masks)
        return merged, stats.to_dict()

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        model.save_pretrained(directory)

    @torch.no_grad()
    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """A LoRA layer merged by peft (on a copy), then re-masked: ``(W~ + s·B A) ⊙ M``, with what re-masking
        removed (``merge_and_remask``'s per-layer numbers)."""
        if not isinstance(module, LoraLayer):
            return None
        if mask is None:
            raise ValueError("LoRA* re-masks the merged weight: the layer's pruning mask is needed")
        mask = mask.to(module.get_base_layer().weight.device)
        delta = sum(module.get_delta_weight(a).float() for a in module.active_adapters)
        delta_sq, removed_sq = float(delta.square().sum()), float(delta.masked_fill(mask, 0.0).square().sum())
        layer = copy.deepcopy(module)
        layer.merge()
        tensors = linear_tensors(layer.get_base_layer())
        stats = {"delta_sq_norm": delta_sq, "removed_sq_norm": removed_sq,
                 "removed_fraction": removed_sq / delta_sq if delta_sq > 0 else 0.0,
                 "pruned_entries": int((~mask).sum()),
                 "pruned_made_nonzero": int(((tensors["weight"] != 0) & ~mask).sum())}
        tensors["weight"] = tensors["weight"].masked_fill(~mask, 0.0)
        return MergedLayer(tensors, stats)

    def merge_summary(self, layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """``merge_and_remask``'s report: the overall share of the update re-masking removed, and per layer."""
        return RemaskStats([LayerRemaskStats(name=n, **s) for n, s in layers.items()]).to_dict()


METHOD = LoRAStar()
