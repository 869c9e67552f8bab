"""``adapter=lora``: the paper's LoRA* baseline (Table 4): peft LoRA, merged, then re-masked with the pruning masks."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from peft.tuners.lora import LoraLayer
from torch import nn

from spp.adapters.base import AdapterMethod, Masks, MergedLayer, PeftIntegration
from spp.adapters.config import AdapterConfig
from spp.adapters.methods.lora.config import LoRAConfig
from spp.adapters.methods.lora.peft_tuner import LORA_STAR_PEFT, PEFT_TYPE, read_lora_star_config
from spp.adapters.methods.lora.remask import (
    LayerRemaskStats,
    RemaskStats,
    cast_factors,
    inject_lora,
    layer_remask_stats,
    lora_layers,
    merge_and_remask,
)
from spp.adapters.peft_base import lora_keys, merged_copy, save_as_peft_type


class LoRAStar(AdapterMethod):
    """LoRA (dense ``W~ + s·B A`` after merge) followed by ``⊙ M``: what re-masking removes is reported."""

    name = "lora"
    config_class = LoRAConfig
    kept_zeros_may_change = True

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        return inject_lora(model, tuple(cfg.targets), r=cfg.r, alpha=cfg.lora_alpha, dropout=cfg.dropout,
                           dtype=cfg.torch_dtype)

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        """``(W~ + s·B A) ⊙ M`` with the masks of the adapted layers (``masks`` may hold more layers)."""
        adapted = [name for name, _ in lora_layers(model)]
        merged, stats = merge_and_remask(model, {n: masks[n] for n in adapted if n in masks})
        return merged, stats.to_dict()

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        """peft's files with ``"peft_type": "LORA_STAR"``: peft alone refuses them rather than merge as plain LoRA."""
        save_as_peft_type(model, directory, PEFT_TYPE)

    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """peft's own files (``LORA_STAR`` or older ``LORA``), settings read as plain LoRA: the merge re-masks. The
        factors keep the file's dtype (``adapter.dtype``), so the merge is the run's own."""
        from peft import PeftModel
        from peft.utils import load_peft_weights, set_peft_model_state_dict

        with self.refusing_other_files(directory, " is not a LoRA adapter of this model",
                                       (OSError, ValueError, KeyError, RuntimeError)):
            peft_cfg = read_lora_star_config(directory)
            model = PeftModel.from_pretrained(model, str(directory), config=peft_cfg)
            state = load_peft_weights(str(directory), device="cpu")
            dtype = next(iter(state.values())).dtype
            set_peft_model_state_dict(cast_factors(model, dtype), state)
        return model, LoRAConfig(**lora_keys(peft_cfg), dtype=str(dtype).removeprefix("torch."))

    @torch.no_grad()
    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """A LoRA layer merged by peft (on a copy), then re-masked, with what re-masking removed."""
        if not isinstance(module, LoraLayer):
            return None
        if mask is None:
            raise ValueError("LoRA* re-masks the merged weight: the layer's pruning mask is needed")
        mask = mask.to(module.get_base_layer().weight.device)
        stats = asdict(layer_remask_stats("", module, mask))
        del stats["name"]
        tensors = merged_copy(module)
        stats["pruned_made_nonzero"] = int(((tensors["weight"] != 0) & ~mask).sum())
        tensors["weight"] = tensors["weight"].masked_fill(~mask, 0.0)
        return MergedLayer(tensors, stats)

    def merge_summary(self, layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """``merge_and_remask``'s report: the overall share of the update re-masking removed, and per layer."""
        return RemaskStats([LayerRemaskStats(name=n, **s) for n, s in layers.items()]).to_dict()

    def peft_integration(self) -> PeftIntegration:
        """LoRA* as a registered peft method (``methods/lora/peft_tuner.py``)."""
        return LORA_STAR_PEFT


METHOD = LoRAStar()
