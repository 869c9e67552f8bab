"""One interface for every pruner: what it measures on the calibration data, and how it decides one matrix.

A :class:`Pruner` says whether it needs calibration, which input statistics to accumulate (over a rank's share
of the batches; :class:`~spp.pruning.statistics.InputStatistics` sums them across ranks), whether it rewrites the
kept weights (SparseGPT) and the per-matrix rule :meth:`Pruner.solve`. A pruner whose rule needs the Hessian is
solved by one *owner* rank per matrix, which broadcasts the result; the others are cheap and deterministic, so
every rank solves every matrix and no result is sent. The engine (``spp/pruning/engine.py``) only talks to this
interface; :data:`PRUNERS` maps ``pruner.name`` to the class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.dsnot import dsnot_refine
from spp.pruning.magnitude import magnitude_mask
from spp.pruning.sparsegpt import inverse_hessian_factor, sparsegpt_prune
from spp.pruning.statistics import InputStatistics
from spp.pruning.wanda import wanda_mask, wanda_scores


@dataclass
class MatrixOutcome:
    """Pruning decision for one matrix; ``weight`` is None when only a mask is applied."""

    mask: torch.Tensor
    weight: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Pruner(ABC):
    """A pruning method (see the module docstring); built from the ``pruner`` group's config."""

    name: ClassVar[str] = ""
    needs_calibration: ClassVar[bool] = True
    updates_weights: ClassVar[bool] = False

    def __init__(self, cfg: PrunerConfig) -> None:
        self.cfg = cfg

    def statistics(self, in_features: int, device: torch.device | str) -> InputStatistics | None:
        """A fresh accumulator of what :meth:`solve` needs about one layer's inputs (``None``: nothing)."""
        return InputStatistics(in_features, device) if self.needs_calibration else None

    @property
    def uses_hessian(self) -> bool:
        """The rule needs X Xᵀ: one owner rank per matrix solves it and broadcasts the result."""
        return False

    @abstractmethod
    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        """The decision for one (out, in) matrix named ``leaf`` inside its block (``q_proj``)."""


class Magnitude(Pruner):
    """Keep the largest |W| (one threshold per matrix, or per N:M group)."""

    name = "magnitude"
    needs_calibration = False

    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        return MatrixOutcome(magnitude_mask(weight, sparsity))


class Wanda(Pruner):
    """Keep the largest |W_ij| · ‖X_j‖₂ per output row (Sun et al., 2024)."""

    name = "wanda"

    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        return MatrixOutcome(wanda_mask(weight, _required(stats, self.name).input_norm_sq, sparsity))


class SparseGPT(Pruner):
    """OBS pruning with weight reconstruction from the Hessian (Frantar & Alistarh, 2023)."""

    name = "sparsegpt"
    updates_weights = True

    def statistics(self, in_features: int, device: torch.device | str) -> InputStatistics:
        return InputStatistics(in_features, device, hessian=True)

    @property
    def uses_hessian(self) -> bool:
        return True

    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        out = sparsegpt_prune(weight, _required(stats, self.name).hessian, sparsity, self.cfg.blocksize,
                              self.cfg.percdamp)
        return MatrixOutcome(out.mask, out.weight, {"obs_loss": out.loss})


class DSnoT(Pruner):
    """Training-free mask refinement from an initial mask (Zhang et al., 2024)."""

    name = "dsnot"

    def statistics(self, in_features: int, device: torch.device | str) -> InputStatistics:
        return InputStatistics(in_features, device, hessian=self.uses_hessian, moments=True)

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
        stats, cfg = _required(stats, self.name), self.cfg
        refine = leaf in set(cfg.refine_targets)
        res = dsnot_refine(weight, self._initial_metric(weight, stats), wanda_scores(weight, stats.input_norm_sq),
                           stats.sequence_sum, stats.var, sparsity, max_cycles=cfg.max_cycles if refine else 0,
                           update_threshold=cfg.update_threshold, pow_of_var_regrowing=cfg.pow_of_var_regrowing,
                           same_sign_check=cfg.same_sign_check)
        info = {"dsnot_refined": refine, "dsnot_cycles": res.cycles,
                "dsnot_error_before": float(res.error_before.abs().sum()),
                "dsnot_error_after": float(res.error_after.abs().sum())}
        return MatrixOutcome(res.mask, None, info)


PRUNERS: dict[str, type[Pruner]] = {p.name: p for p in (Magnitude, Wanda, SparseGPT, DSnoT)}
"""``pruner.name`` -> its class (``none`` prunes nothing and has no class)."""


def get_pruner(cfg: PrunerConfig) -> Pruner:
    """The pruner ``cfg.name`` names, built from ``cfg``.

    Raises:
        ValueError: ``none`` or an unknown name (lists the known ones).
    """
    if cfg.name not in PRUNERS:
        raise ValueError(f"pruner.name={cfg.name!r} does not prune matrices; use one of {sorted(PRUNERS)}")
    return PRUNERS[cfg.name](cfg)


def _required(stats: InputStatistics | None, name: str) -> InputStatistics:
    if stats is None:
        raise ValueError(f"pruner {name} needs calibration statistics")
    return stats


def statistics_for(pruner: PrunerConfig, in_features: int, device: torch.device | str) -> InputStatistics | None:
    """An ``InputStatistics`` collecting exactly what ``pruner`` needs (``None`` for magnitude)."""
    return get_pruner(pruner).statistics(in_features, device)


def prune_matrix(leaf: str, weight: torch.Tensor, stats: InputStatistics | None, pruner: PrunerConfig,
                 sparsity: SparsityConfig) -> MatrixOutcome:
    """The decision of ``pruner`` for one (out, in) matrix (see :meth:`Pruner.solve`)."""
    return get_pruner(pruner).solve(leaf, weight, stats, sparsity)
