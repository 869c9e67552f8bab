"""DS⊘T's config and :class:`~spp.pruning.base.Pruner`: the initial mask's metric (Wanda, SparseGPT or magnitude)
refined by :func:`~spp.pruning.pruners.dsnot.rule.dsnot_refine`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spp.projections import ATTENTION_TARGETS, is_attention, is_default, matches
from spp.pruning.base import MatrixOutcome, Pruner, required
from spp.pruning.config import CACHE_KEY, KEY_REASON, UNORDERED, PrunerConfig, SparsityConfig
from spp.pruning.pruners.dsnot.rule import dsnot_refine
from spp.pruning.pruners.sparsegpt.rule import inverse_hessian_factor
from spp.pruning.pruners.wanda.rule import wanda_scores
from spp.pruning.statistics import InputStatistics

INITIAL_METHODS: tuple[str, ...] = ("wanda", "sparsegpt", "magnitude")
"""DS⊘T's initial masks (``pruner.initial_method``)."""


def _uses_sparsegpt(cfg: DSnoTConfig) -> bool:
    return cfg.initial_method == "sparsegpt"


@dataclass
class DSnoTConfig(PrunerConfig):
    """DS⊘T: training-free refinement of an initial mask; the sparsity is kept exactly.

    Attributes:
        initial_method: The initial mask (``wanda``, ``sparsegpt`` or ``magnitude``).
        max_cycles: Maximum number of swap cycles.
        update_threshold: Stop refining a row once |expected reconstruction error| <= this.
        pow_of_var_regrowing: Regrowth score = contribution / var^this.
        same_sign_check: Unstructured: also stop a row when a swap would flip the sign of its error (the
            reference's ``--without_same_sign False``; N:M always checks).
        refine_targets: Sublayers refined; the rest keep their initial mask. Default: attention only (every
            projection under the block's attention module, whatever the family), as the reference's default
            ``--skip_layer mlp``.
        percdamp: The SparseGPT initial metric's damping (fraction of mean(diag H); ``initial_method=sparsegpt``).
    """

    name: str = "dsnot"
    initial_method: str = "wanda"
    max_cycles: int = 50
    update_threshold: float = 0.1
    pow_of_var_regrowing: float = 1.0
    same_sign_check: bool = False
    refine_targets: list[str] = field(default_factory=lambda: list(ATTENTION_TARGETS), metadata={UNORDERED: True})
    percdamp: float = field(default=0.01, metadata={
        CACHE_KEY: _uses_sparsegpt, KEY_REASON: "only the SparseGPT initial metric reads it"})

    def validate(self) -> DSnoTConfig:
        """The shared checks, then ``initial_method``, ``max_cycles`` and ``percdamp`` (``ValueError``)."""
        super().validate()
        if self.initial_method not in INITIAL_METHODS:
            raise ValueError(f"pruner.initial_method={self.initial_method!r} is not one of {INITIAL_METHODS}")
        if self.max_cycles < 0:
            raise ValueError(f"pruner.max_cycles={self.max_cycles} must be >= 0")
        if not self.percdamp > 0:
            raise ValueError(f"pruner.percdamp={self.percdamp} must be > 0")
        return self


class DSnoT(Pruner):
    """Training-free mask refinement from an initial mask (Zhang et al., 2024)."""

    needs_moments = True
    cfg: DSnoTConfig

    @property
    def uses_hessian(self) -> bool:
        return self.cfg.initial_method == "sparsegpt"

    def _initial_metric(self, weight: torch.Tensor, stats: InputStatistics) -> torch.Tensor:
        if self.cfg.initial_method == "wanda":
            return wanda_scores(weight, stats.input_norm_sq)
        if self.cfg.initial_method == "magnitude":
            return weight.detach().abs().float()
        U, dead = inverse_hessian_factor(stats.hessian, self.cfg.percdamp)
        W = weight.detach().float().clone()
        W[:, dead] = 0
        return W**2 / torch.diag(U).reshape(1, -1) ** 2

    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        stats, cfg = required(stats, self.name), self.cfg
        refine = (is_attention(leaf) or leaf.rsplit(".", 1)[-1] in ATTENTION_TARGETS
                  if is_default(cfg.refine_targets, ATTENTION_TARGETS) else matches(leaf, cfg.refine_targets))
        res = dsnot_refine(weight, self._initial_metric(weight, stats), wanda_scores(weight, stats.input_norm_sq),
                           stats.sequence_sum, stats.var, sparsity, max_cycles=cfg.max_cycles if refine else 0,
                           update_threshold=cfg.update_threshold, pow_of_var_regrowing=cfg.pow_of_var_regrowing,
                           same_sign_check=cfg.same_sign_check)
        info = {"dsnot_refined": refine, "dsnot_cycles": res.cycles,
                "dsnot_error_before": float(res.error_before.abs().sum()),
                "dsnot_error_after": float(res.error_after.abs().sum())}
        return MatrixOutcome(res.mask, None, info)
