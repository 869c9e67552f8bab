"""Magnitude pruning's config and :class:`~spp.pruning.base.Pruner`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spp.pruning.base import MatrixOutcome, Pruner
from spp.pruning.config import CACHE_KEY, KEY_REASON, PrunerConfig, SparsityConfig
from spp.pruning.pruners.magnitude.rule import magnitude_mask
from spp.pruning.statistics import InputStatistics


@dataclass
class MagnitudeConfig(PrunerConfig):
    """Magnitude pruning: |W|, one threshold per matrix (unstructured) or per N:M group; no calibration data.

    Attributes:
        true_sequential: Unused: magnitude reads no activations.
    """

    name: str = "magnitude"
    true_sequential: bool = field(default=False, metadata={
        CACHE_KEY: False, KEY_REASON: "magnitude reads no activations, so the calibration order cannot matter"})


class Magnitude(Pruner):
    """Keep the largest |W| (one threshold per matrix, or per N:M group)."""

    needs_calibration = False

    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        return MatrixOutcome(magnitude_mask(weight, sparsity))
