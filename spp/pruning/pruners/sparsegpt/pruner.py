"""SparseGPT's config and :class:`~spp.pruning.base.Pruner`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spp.pruning.base import MatrixOutcome, Pruner, required
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.pruners.sparsegpt import rule
from spp.pruning.statistics import InputStatistics


@dataclass
class SparseGPTConfig(PrunerConfig):
    """SparseGPT: OBS pruning with H = 2/N Σ X Xᵀ, damping, lazy block updates.

    Attributes:
        blocksize: Column block width (must be a multiple of ``sparsity.m`` for N:M).
        percdamp: Damping, as a fraction of mean(diag H).
    """

    name: str = "sparsegpt"
    blocksize: int = 128
    percdamp: float = 0.01

    def validate(self) -> SparseGPTConfig:
        """The shared checks, then ``blocksize`` >= 1 and ``percdamp`` > 0 (``ValueError`` naming the key)."""
        super().validate()
        if self.blocksize < 1:
            raise ValueError(f"pruner.blocksize={self.blocksize} must be a positive integer")
        if not self.percdamp > 0:
            raise ValueError(f"pruner.percdamp={self.percdamp} must be > 0")
        return self


class SparseGPT(Pruner):
    """OBS pruning with weight reconstruction from the Hessian (Frantar & Alistarh, 2023)."""

    updates_weights = True
    uses_hessian = True  # always: a constant in place of the base's property
    cfg: SparseGPTConfig

    def check(self, sparsity: SparsityConfig) -> None:
        if sparsity.kind == "nm" and self.cfg.blocksize % int(sparsity.m):
            raise ValueError(f"pruner.blocksize={self.cfg.blocksize} must be a multiple of sparsity.m={sparsity.m}")

    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        out = rule.sparsegpt_prune(weight, required(stats, self.name).hessian, sparsity, self.cfg.blocksize,
                                   self.cfg.percdamp)
        return MatrixOutcome(out.mask, out.weight, {"obs_loss": out.loss})
