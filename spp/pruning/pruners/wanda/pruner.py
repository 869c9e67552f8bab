"""Wanda's config and :class:`~spp.pruning.base.Pruner`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spp.pruning.base import MatrixOutcome, Pruner, required
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.pruners.wanda.rule import wanda_mask
from spp.pruning.statistics import InputStatistics


@dataclass
class WandaConfig(PrunerConfig):
    """Wanda: |W_ij| · ‖X_j‖₂ over all calibration tokens, compared per output row (or per N:M group); only the
    shared settings (``targets``, ``true_sequential``)."""

    name: str = "wanda"


class Wanda(Pruner):
    """Keep the largest |W_ij| · ‖X_j‖₂ per output row (Sun et al., 2024)."""


    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        return MatrixOutcome(wanda_mask(weight, required(stats, self.name).input_norm_sq, sparsity))
