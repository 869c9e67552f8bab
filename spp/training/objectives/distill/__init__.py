"""``objective=distill``: train the pruned student against its dense model (SquareHead, arXiv 2310.06927).

``L = kl_weight · L_KL + feature_weight · L_feat + ce_weight · L_CE`` (terms in
:mod:`spp.training.objectives.distill.loss`); ``train/ce``, ``train/kl``, ``train/feature`` are logged beside it.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from spp.training.objectives.base import (
    Objective,
    ObjectiveConfig,
    ObjectiveLoss,
    StudentFn,
    block_outputs,
    register_objective,
    teacher_forward,
)
from spp.training.objectives.distill.loss import feature_l2, logit_kl, loss_positions


@dataclass
class DistillConfig(ObjectiveConfig):
    """``objective=distill``: distillation from the dense model (SquareHead; Kurtic et al., arXiv 2310.06927).

    Attributes:
        name: ``distill``.
        temperature: Softmax temperature ``T`` of the logit KL (scaled by ``T²``).
        kl_weight: Weight of the logit KL ``L_KL`` (``KL(p_teacher ‖ p_student)`` per scored token).
        feature_weight: Weight of SquareHead's feature term ``L_feat`` (per decoder block
            ``‖h_s − h_t‖² / ‖h_t‖²``, averaged over blocks); ``0`` runs the teacher for its logits only.
        ce_weight: Weight of the labels' cross-entropy (``0``: the student learns from the teacher alone).
    """

    name: str = "distill"
    temperature: float = 1.0
    kl_weight: float = 1.0
    feature_weight: float = 1.0
    ce_weight: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"objective.temperature={self.temperature} must be a finite number > 0")
        for key in ("kl_weight", "feature_weight", "ce_weight"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"objective.{key}={value} must be a finite number >= 0")
        if self.kl_weight == 0 and self.feature_weight == 0:
            raise ValueError("objective.kl_weight=0 and objective.feature_weight=0 leave nothing to distil; "
                             "set one > 0, or use objective=ce")

    @property
    def teacher_outputs(self) -> str:
        """The teacher's logits, and its block outputs when ``feature_weight > 0``."""
        return "block_outputs" if self.feature_weight > 0 else "logits"


@register_objective
class Distill(Objective):
    """The distillation loss of :class:`DistillConfig` (module docstring)."""

    name = "distill"
    config_class = DistillConfig
    cfg: DistillConfig

    def loss(self, student: StudentFn, batch: dict[str, torch.Tensor],
             teacher: nn.Module | None = None) -> ObjectiveLoss:
        """Teacher forward without gradients, student forward, then ``L`` and its parts (module docstring)."""
        if teacher is None:
            raise RuntimeError("objective=distill needs the dense teacher (SPPModule keeps it from the pruning "
                               "callback)")
        cfg, features = self.cfg, self.cfg.feature_weight > 0
        t_out, t_blocks = teacher_forward(teacher, batch, self.layer_cls if features else None)
        with block_outputs(student, self.layer_cls) if features else nullcontext([]) as s_blocks:
            s_out = student(**batch, use_cache=False)
        mask = loss_positions(batch["labels"])
        kl = logit_kl(s_out.logits, t_out.logits, mask, cfg.temperature)
        loss = cfg.kl_weight * kl
        parts = {"ce": s_out.loss.detach(), "kl": kl.detach()}
        if features:
            feat = feature_l2(s_blocks, t_blocks, mask)
            loss = loss + cfg.feature_weight * feat
            parts["feature"] = feat.detach()
        if cfg.ce_weight > 0:
            loss = loss + cfg.ce_weight * s_out.loss
        return ObjectiveLoss(loss, parts)
