"""``adapter=sparse_lora``: SparsePEFT (SQFT): LoRA whose update ``s·(B A) ⊙ M`` is masked in training and merge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.adapters.base import (
    AdapterMethod,
    ExternalParameters,
    Full,
    Masks,
    MergedLayer,
    PeftIntegration,
)
from spp.adapters.config import AdapterConfig
from spp.adapters.methods.sparse_lora.config import SparseLoRAConfig
from spp.adapters.methods.sparse_lora.layer import (
    SparseLoraLinear,
    inject_sparse_lora,
    load_sparse_lora,
    merge_sparse_lora,
    read_lora_config,
    save_sparse_lora,
    sparse_lora_layers,
)
from spp.adapters.methods.sparse_lora.peft_tuner import SPARSE_LORA_PEFT
from spp.adapters.peft_base import lora_keys, merged_copy


class SparseLoRA(AdapterMethod):
    """peft LoRA (r, lora_alpha, dropout, targets as ``adapter=lora``) with the masked variant; zeros kept exactly."""

    name = "sparse_lora"
    config_class = SparseLoRAConfig
    summed_stats = ("delta_sq_norm", "pruned_nonzero")  # as merge_sparse_lora reports

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        return inject_sparse_lora(model, masks, targets=tuple(cfg.targets), r=cfg.r, alpha=cfg.lora_alpha,
                                  dropout=cfg.dropout, dtype=cfg.torch_dtype)

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        return merge_sparse_lora(model)

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        save_sparse_lora(model, directory, extra)

    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """peft's files plus ``sparse_lora.json`` (:func:`~spp.adapters.methods.sparse_lora.layer.load_sparse_lora`)."""
        with self.refusing_other_files(directory):
            peft_cfg, _ = read_lora_config(directory)
            model = load_sparse_lora(model, directory, masks)
        return model, SparseLoRAConfig(**lora_keys(peft_cfg))

    def effective_weight(self, module: nn.Module, full: Full) -> torch.Tensor | None:
        """A SparsePEFT layer's ``W~ + s·(B A) ⊙ M`` (its own ``effective_weight``, from the gathered tensors)."""
        return module.effective_weight(full) if isinstance(module, SparseLoraLinear) else None

    def resident_terms(self, adapted_weights: int) -> dict[str, int]:
        """Each adapted layer's packed mask (a bit per weight) on every device."""
        return {"mask_buffers": adapted_weights // 8}

    def external_parameters(self, model: nn.Module) -> ExternalParameters:
        """The masked branch reads ``lora_A`` / ``lora_B`` weights without calling those modules."""
        return [(layer, factors[adapter].weight) for _, layer in sparse_lora_layers(model) for adapter in layer.lora_A
                for factors in (layer.lora_A, layer.lora_B)]

    @torch.no_grad()
    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """A SparsePEFT layer merged by its own variant (on a copy): ``W~ + s·(B A) ⊙ M``."""
        if not isinstance(module, SparseLoraLinear):
            return None
        tensors = merged_copy(module)
        pruned_nonzero = int(((tensors["weight"] != 0) & ~module.mask.to(tensors["weight"].device)).sum())
        return MergedLayer(tensors, {"delta_sq_norm": module.delta_sq_norm(), "pruned_nonzero": pruned_nonzero})

    def peft_integration(self) -> PeftIntegration:
        """SparsePEFT as a registered peft method (``methods/sparse_lora/peft_tuner.py``)."""
        return SPARSE_LORA_PEFT


METHOD = SparseLoRA()
