"""``adapter=sparse_lora``: SparsePEFT (SQFT): LoRA whose update ``s·(B A) ⊙ M`` is masked in training and merge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from spp.adapters.base import DTYPES, AdapterMethod, ExternalParameters, Masks
from spp.adapters.config import AdapterConfig
from spp.adapters.sparse_lora import external_parameters, inject_sparse_lora, merge_sparse_lora, save_sparse_lora


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


METHOD = SparseLoRA()
