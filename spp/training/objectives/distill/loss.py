"""The distillation terms as plain functions of tensors (SquareHead, Kurtic et al., arXiv 2310.06927, §3).

``M``: the scored positions (``labels[i + 1] != -100``); ``z``: logits; ``h^l``: the output of block ``l`` of ``L``.

* Logit distillation (Hinton et al., arXiv 1503.02531), ``T²`` keeping the gradient on the scale of ``T = 1``::

      L_KL = T² · (1/|M|) Σ_{i ∈ M} KL(p_t,i ‖ p_s,i),   p_·,i = softmax(z_·,i / T)

* Feature distillation (SquareHead ``L_feat``), averaged over blocks so its weight does not grow with depth::

      L_feat = (1/L) Σ_l  Σ_{i ∈ M} ‖h_s,i^l − h_t,i^l‖² / Σ_{i ∈ M} ‖h_t,i^l‖²
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spp.data.tokenization import IGNORE_INDEX


def loss_positions(labels: torch.Tensor) -> torch.Tensor:
    """Boolean ``(batch, seq)`` mask ``M``: position ``i`` is scored when ``labels[:, i + 1] != -100`` (the last
    position never is)."""
    mask = torch.zeros_like(labels, dtype=torch.bool)
    mask[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    return mask


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def logit_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor,
             temperature: float = 1.0) -> torch.Tensor:
    """``L_KL`` (module docstring): ``T²`` times the mean over the scored positions of ``KL(p_t ‖ p_s)`` at ``T``,
    in at least float32 (0 when no position is scored). Masked by selection, not by indexing: no host sync."""
    s = torch.log_softmax(_at_least_fp32(student_logits) / temperature, dim=-1)
    t = torch.log_softmax(_at_least_fp32(teacher_logits) / temperature, dim=-1)
    per_token = torch.where(mask, (t.exp() * (t - s)).sum(dim=-1), 0.0)
    return per_token.sum() / mask.sum().clamp_min(1) * temperature**2


def feature_l2(student_blocks: Sequence[torch.Tensor], teacher_blocks: Sequence[torch.Tensor],
               mask: torch.Tensor) -> torch.Tensor:
    """``L_feat`` (module docstring), in at least float32 (0 when no position is scored).

    Raises:
        ValueError: the two lists differ in length or are empty.
    """
    if len(student_blocks) != len(teacher_blocks) or not student_blocks:
        raise ValueError(f"feature distillation needs one output per block of both models, got "
                         f"{len(student_blocks)} (student) and {len(teacher_blocks)} (teacher)")
    terms = []
    for h_s, h_t in zip(student_blocks, teacher_blocks, strict=True):
        s, t = _at_least_fp32(h_s), _at_least_fp32(h_t)
        num = torch.where(mask, (s - t).pow(2).sum(dim=-1), 0.0).sum()
        den = torch.where(mask, t.pow(2).sum(dim=-1), 0.0).sum()
        terms.append(num / den.clamp_min(torch.finfo(t.dtype).tiny))
    return torch.stack(terms).mean()
