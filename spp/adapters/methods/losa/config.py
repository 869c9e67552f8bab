"""``adapter=losa``'s keys: LoRA's (``r`` is the mean rank), the rank floor and ceiling, and the blocks' errors."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from spp.adapters.methods.lora.config import LoRAConfig


@dataclass
class LoSAConfig(LoRAConfig):
    """LoSA (Huang et al., ICLR 2025): SparsePEFT's masked update with one rank per decoder block.

    Attributes:
        r: The mean rank over the blocks (the budget: ``Σ_l r_l = L · r``, so it trains as many values as LoRA* and
            SparsePEFT at the same ``r``).
        lora_alpha: LoRA ``alpha``; every layer is scaled by ``lora_alpha / r`` whatever its own rank (the
            reference's choice: its layers keep the config's scaling when their rank changes).
        rank_min: Floor of a block's rank (the reference's ``min_rank = 1``).
        rank_max: Ceiling of a block's rank; ``0``: ``2 r`` (the reference's ``max_rank = 16`` at ``r = 8``).
        block_errors: Each decoder block's reconstruction error of the pruned model against the dense one
            (:func:`~spp.adapters.methods.losa.allocation.block_errors`, the paper's Sec. 3.4); ranks are
            proportional to it. ``null``: ``train.py`` measures them after pruning on the first ``error_windows``
            calibration windows; where nothing measures them (a model adapted outside the pipeline, the plan's
            skeleton) every block gets ``r`` (SparsePEFT's update).
        error_windows: How many calibration windows the errors are measured on (``0``: all; the reference uses its
            128, which costs two forward passes of the model over them on rank 0's CPU).
    """

    method: ClassVar[str] = "losa"

    name: str = "losa"
    rank_min: int = 1
    rank_max: int = 0
    block_errors: list[float] | None = None
    error_windows: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.rank_min <= self.r:
            raise ValueError(f"adapter.rank_min={self.rank_min} must be in [1, adapter.r={self.r}]")
        if self.rank_max != 0 and self.rank_max < self.r:
            raise ValueError(f"adapter.rank_max={self.rank_max} must be >= adapter.r={self.r} (or 0 for 2 r)")
        if self.error_windows < 0:
            raise ValueError(f"adapter.error_windows={self.error_windows} must be >= 0 (0: every calibration window)")
        if self.block_errors is not None:
            bad = [e for e in self.block_errors if not (math.isfinite(float(e)) and float(e) >= 0.0)]
            if bad or len(self.block_errors) == 0:
                raise ValueError(f"adapter.block_errors must be a non-empty list of finite errors >= 0, got "
                                 f"{list(self.block_errors)[:4]}; measure them with losa.allocation.block_errors")

    @property
    def ceiling(self) -> int:
        """The rank ceiling in use (``rank_max``, or ``2 r`` when 0)."""
        return self.rank_max or 2 * self.r
