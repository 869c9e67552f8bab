"""``objective=ce``: the causal-LM cross-entropy on the Alpaca labels (the paper's loss, the default).

``L = -(1/|M|) Σ_{i ∈ M} log p_s(y_{i+1} | y_{≤i})``, exactly the ``loss`` ``transformers`` returns for ``labels``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from spp.training.objectives.base import Objective, ObjectiveConfig, ObjectiveLoss, StudentFn, register_objective


@dataclass
class CEConfig(ObjectiveConfig):
    """``objective=ce``: cross-entropy on the labels; no key of its own.

    Attributes:
        name: ``ce``.
    """

    name: str = "ce"


@register_objective
class CrossEntropy(Objective):
    """The causal-LM loss ``transformers`` computes from ``labels`` (module docstring)."""

    name = "ce"
    config_class = CEConfig

    def loss(self, student: StudentFn, batch: dict[str, torch.Tensor],
             teacher: nn.Module | None = None) -> ObjectiveLoss:
        """``student(**batch).loss``; nothing else is logged (``train/loss`` is the cross-entropy)."""
        return ObjectiveLoss(student(**batch, use_cache=False).loss)
