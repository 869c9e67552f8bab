"""The one interface of every pruner: the statistics it needs and its per-matrix rule (:meth:`Pruner.solve`).
A rule with ``uses_hessian`` is solved by one owner rank per matrix and broadcast; cheap deterministic rules run on
every rank. A pruner is a folder whose ``__init__`` calls :func:`spp.pruning.registry.register_pruner`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.statistics import InputStatistics


@dataclass
class MatrixOutcome:
    """Pruning decision for one matrix: the keep-mask (True = kept); ``weight`` is the rewritten matrix of a pruner
    that updates weights (``None``: only the mask is applied); ``info`` goes to the report's per-layer row."""

    mask: torch.Tensor
    weight: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Pruner(ABC):
    """A pruning method, built from its config (``self.cfg``); ``name`` and ``config_class`` are set by
    ``register_pruner``, ``updates_weights`` says :meth:`solve` returns new values for the kept weights."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type[PrunerConfig]] = PrunerConfig
    needs_calibration: ClassVar[bool] = True
    updates_weights: ClassVar[bool] = False
    needs_moments: ClassVar[bool] = False
    """The rule needs the per-feature input sums (mean, variance, per-sequence sums: DS⊘T)."""

    def __init__(self, cfg: PrunerConfig) -> None:
        self.cfg = cfg

    @property
    def uses_hessian(self) -> bool:
        """The rule needs X Xᵀ: it is accumulated, and one owner rank per matrix solves and broadcasts."""
        return False

    def statistics(self, in_features: int, device: torch.device | str) -> InputStatistics | None:
        """A fresh accumulator of what :meth:`solve` needs about one layer's inputs (``None``: nothing)."""
        if not self.needs_calibration:
            return None
        return InputStatistics(in_features, device, hessian=self.uses_hessian, moments=self.needs_moments)

    def check(self, sparsity: SparsityConfig) -> None:  # noqa: B027 - optional hook: most pruners take any pattern
        """Raise ``ValueError`` (naming the key) for a pattern this pruner cannot produce; called before any work."""

    @abstractmethod
    def solve(self, leaf: str, weight: torch.Tensor, stats: InputStatistics | None,
              sparsity: SparsityConfig) -> MatrixOutcome:
        """The decision for one (out, in) matrix; ``leaf`` is its path inside the block (``self_attn.q_proj``)."""


def required(stats: InputStatistics | None, name: str) -> InputStatistics:
    """``stats``, or ``ValueError`` when a calibrating pruner got none."""
    if stats is None:
        raise ValueError(f"pruner {name} needs calibration statistics")
    return stats
