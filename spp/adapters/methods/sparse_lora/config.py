"""``adapter=sparse_lora``'s keys: LoRA's (``r``, ``lora_alpha``, ``dropout``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from spp.adapters.methods.lora.config import LoRAConfig


@dataclass
class SparseLoRAConfig(LoRAConfig):
    """SparsePEFT: LoRA whose update ``s·(B A) ⊙ M`` is masked in training and merge (keys as ``adapter=lora``)."""

    method: ClassVar[str] = "sparse_lora"

    name: str = "sparse_lora"
