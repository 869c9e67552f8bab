"""``adapter=lora``'s keys (the LoRA* baseline, paper Table 4); ``adapter=sparse_lora`` has the same ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from spp.adapters.config import AdapterConfig, check_dropout, check_rank


@dataclass
class LoRAConfig(AdapterConfig):
    """peft LoRA: ``y = x W~ᵀ + s · dropout(x) Aᵀ Bᵀ`` with ``s = lora_alpha / r`` (paper LoRA*: r 8, alpha 16).

    Attributes:
        r: Rank of ``A`` (r x n) and ``B`` (m x r).
        lora_alpha: LoRA ``alpha`` (scaling ``lora_alpha / r``).
        dropout: Dropout on the LoRA branch input.
    """

    method: ClassVar[str] = "lora"

    name: str = "lora"
    r: int = 8
    lora_alpha: float = 16.0
    dropout: float = 0.05

    def __post_init__(self) -> None:
        super().__post_init__()
        check_rank(self.r)
        check_dropout(self.dropout)
