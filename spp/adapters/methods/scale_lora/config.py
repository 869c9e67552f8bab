"""``adapter=scale_lora``'s keys (PERP's ScaleLoRA, Zimmer et al., arXiv 2312.15230)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from spp.adapters.config import AdapterConfig, check_rank


@dataclass
class ScaleLoRAConfig(AdapterConfig):
    """ScaleLoRA: the effective weight is ``W ⊙ (B A)`` with ``B`` (m x r) and ``A`` (r x n) starting at ``1/√r``
    (so ``B A`` starts as all ones and the model as the pruned one); merged by multiplying ``W`` in place.

    Attributes:
        r: Rank of the multiplier ``B A``.
    """

    method: ClassVar[str] = "scale_lora"

    name: str = "scale_lora"
    r: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        check_rank(self.r)
