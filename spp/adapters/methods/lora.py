"""``adapter=lora``: the paper's LoRA* baseline (Table 4): peft LoRA, merged, then re-masked with the pruning masks."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from peft.tuners.lora import LoraLayer
from torch import nn

from spp.adapters.base import AdapterMethod, Masks, linear_tensors
from spp.adapters.config import AdapterConfig
from spp.adapters.lora_star import inject_lora, merge_and_remask


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

    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> dict[str, torch.Tensor] | None:
        """A LoRA layer merged by peft (on a copy), then re-masked: ``(W~ + s·B A) ⊙ M`` (``merge_and_remask``)."""
        if not isinstance(module, LoraLayer):
            return None
        if mask is None:
            raise ValueError("LoRA* re-masks the merged weight: the layer's pruning mask is needed")
        layer = copy.deepcopy(module)
        layer.merge()
        out = linear_tensors(layer.get_base_layer())
        out["weight"] = out["weight"].masked_fill(~mask.to(out["weight"].device), 0.0)
        return out


METHOD = LoRAStar()
