"""RIA's config and :class:`~spp.pruning.base.Pruner`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spp.pruning.base import MatrixOutcome, Pruner, required
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.patterns import check_nm
from spp.pruning.pruners.ria.rule import ria_mask, ria_scores
from spp.pruning.statistics import InputStatistics

SCOPES: tuple[str, ...] = ("matrix", "row")
"""Where unstructured RIA compares scores: the whole matrix (the reference's default) or each output row."""


@dataclass
class RIAConfig(PrunerConfig):
    """RIA: relative importance |W_ij|/Σ_col + |W_ij|/Σ_row times ‖X_j‖₂^a (Zhang et al., ICLR 2024).

    Attributes:
        a: The activation exponent (paper: 0.5).
        scope: Unstructured comparison: ``matrix`` (one threshold per matrix, the reference's default) or ``row``
            (per output row, the reference's ``--per_outneuron``).
        permute: N:M only: channel reallocation (the reference's ``--reallocation``); the mask is then N:M in a
            per-matrix permuted column order, recorded as ``ria_permuted_nm_valid`` in the report.
    """

    name: str = "ria"
    a: float = 0.5
    scope: str = "matrix"
    permute: bool = False

    def validate(self) -> RIAConfig:
        """The shared checks, then ``a`` and ``scope`` (``ValueError`` naming the key)."""
        super().validate()
        if not math.isfinite(float(self.a)) or float(self.a) < 0:
            raise ValueError(f"pruner.a={self.a} must be a finite number >= 0 (the paper's 0.5)")
        if self.scope not in SCOPES:
            raise ValueError(f"pruner.scope={self.scope!r} must be one of {SCOPES}")
        return self


class RIA(Pruner):
    """Keep the largest relative importance times activation norm^a (per matrix, per row or per N:M group)."""

    cfg: RIAConfig

    def check(self, sparsity: SparsityConfig) -> None:
        if self.cfg.permute and sparsity.kind != "nm":
            raise ValueError(f"pruner.permute=true reorders channels for N:M only, not sparsity={sparsity.name}; "
                             "set pruner.permute=false or choose an N:M sparsity (e.g. sparsity=nm2_4)")

    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        scores = ria_scores(weight, required(stats, self.name).input_norm_sq, self.cfg.a)
        mask, order = ria_mask(scores, sparsity, self.cfg.scope, self.cfg.permute)
        if order is None:
            return MatrixOutcome(mask)
        valid = bool(check_nm(mask[:, order], *sparsity.nm_pair))
        return MatrixOutcome(mask, None, {"ria_permuted_nm_valid": valid})
