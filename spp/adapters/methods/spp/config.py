"""``adapter=spp``'s keys (paper Sec. 3.2, Eq. 5/6)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

from spp.adapters.config import AdapterConfig, check_dropout, check_rank
from spp.choices import Choice


class Init(Choice):
    """Initialisation of an SPP tensor (``kaiming`` = ``nn.Linear``'s default, as the authors' alpha)."""

    kaiming = "kaiming"
    zeros = "zeros"
    ones = "ones"


class Impl(Choice):
    """Exact SPP forward implementations (``spp.adapters.methods.spp.layer.IMPLS``)."""

    fused = "fused"
    naive = "naive"
    blocked = "blocked"
    fused_cached = "fused_cached"


@dataclass
class SPPAdapterConfig(AdapterConfig):
    """SPP: ``alpha`` (r x n) and ``beta`` (m x 1) scale the frozen pruned weight element-wise (Eq. 5/6).

    Attributes:
        r: Rows of ``alpha`` (must divide every target's out-features).
        scale: Scaling ``s`` of Eq. 6 (authors: lora_alpha 16 / lora_r 8 = 2.0).
        dropout: Dropout on the adapter branch input only.
        alpha_init: ``alpha`` initialisation.
        beta_init: ``beta`` initialisation (``zeros`` as the authors).
        use_beta: With the ``beta`` column (Table 8 ablation: without it alpha must start at zero).
        impl: Forward implementation (all exact; ``fused`` is the fastest measured).
        residual: The residual form ``y = x W~^T + s dropout(x) W~'^T`` (Eq. 6); ``false`` is the multiplicative
            ablation.
    """

    method: ClassVar[str] = "spp"

    name: str = "spp"
    r: int = 16
    scale: float = 2.0
    dropout: float = 0.05
    alpha_init: Init = Init.kaiming
    beta_init: Init = Init.zeros
    use_beta: bool = True
    impl: Impl = Impl.fused
    residual: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_rank(self.r)
        check_dropout(self.dropout)
        if not math.isfinite(self.scale):
            raise ValueError(f"adapter.scale={self.scale} must be a finite number")


LAYER_KEYS = tuple(f.name for f in fields(SPPAdapterConfig) if f.name not in {g.name for g in fields(AdapterConfig)})
"""SPP's own settings (``r`` ... ``residual``): the :class:`~spp.adapters.methods.spp.layer.SPPLinear` keyword
arguments an adapter folder records, in :class:`SPPAdapterConfig`'s order."""
