"""LoSA's per-block ranks from the blocks' reconstruction errors (Huang et al., ICLR 2025, arXiv 2502.14816, Sec. 3.4).

``E_l = Σ_{t,j} ((F_l[t,j] − F~_l[t,j]) / ‖F_l[:,j]‖₂)² / d`` (dense ``F``, pruned ``F~``, each feature scaled by its
dense norm as the reference does); ``r_l = clip(round(L · r̄ · E_l / Σ_k E_k), r_min, r_max)``, then repaired one
rank at a time until ``Σ_l r_l = L · r̄`` (surplus from the smallest errors, deficit to the largest).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from spp.projections import decoder_layers

NORM_FLOOR = 1e-12
"""Floor of a feature's dense norm (a feature that is exactly zero in every dense output)."""


def allocate_ranks(errors: Sequence[float], mean_rank: int, floor: int, ceiling: int) -> list[int]:
    """Each block's rank (module docstring); equal or all-zero errors give ``mean_rank`` everywhere."""
    if not floor <= mean_rank <= ceiling:
        raise ValueError(f"the mean rank {mean_rank} must lie in [rank_min={floor}, rank_max={ceiling}]")
    e = torch.tensor([float(v) for v in errors], dtype=torch.float64)
    if e.numel() == 0 or not bool(torch.isfinite(e).all()) or bool((e < 0).any()):
        raise ValueError(f"block errors must be finite and >= 0, got {list(errors)[:4]}")
    blocks, budget = e.numel(), e.numel() * mean_rank
    total = float(e.sum())
    share = e / total * budget if total > 0 else torch.full_like(e, float(mean_rank))
    ranks = [min(max(int(v), floor), ceiling) for v in torch.round(share).tolist()]
    up = sorted(range(blocks), key=lambda i: (-float(e[i]), i))  # largest error first
    down = up[::-1]  # smallest error first
    diff = sum(ranks) - budget
    while diff != 0:
        order, step, bound = (down, -1, floor) if diff > 0 else (up, 1, ceiling)
        for i in order:
            if diff != 0 and ranks[i] != bound:
                ranks[i] += step
                diff += step
    return ranks


def _block_outputs(model: nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every decoder block's outputs on the token ids ``ids``, as ``(tokens, hidden)`` float64 per block."""
    _, layers = decoder_layers(model)
    outputs: list[torch.Tensor] = [torch.empty(0)] * len(layers)

    def keep(i: int):
        def hook(_module: nn.Module, _inputs: tuple, out: object) -> None:
            h = out[0] if isinstance(out, tuple) else out
            outputs[i] = h.detach().reshape(-1, h.shape[-1]).double().cpu()
        return hook

    handles = [layer.register_forward_hook(keep(i)) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():  # the decoder alone (transformers' ``base_model``): the LM head is not needed
            getattr(model, "base_model", model)(input_ids=ids.to(next(model.parameters()).device))
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def block_errors(dense: nn.Module, pruned: nn.Module, batches: Sequence[torch.Tensor]) -> list[float]:
    """``E_l`` of every decoder block on the calibration token ``batches``, one batch's outputs held at a time."""
    if len(batches) == 0:
        raise ValueError("block_errors needs at least one calibration batch of token ids")
    diff: list[torch.Tensor] = []
    norm: list[torch.Tensor] = []
    for ids in batches:
        pairs = list(zip(_block_outputs(dense, ids), _block_outputs(pruned, ids), strict=True))
        if not diff:
            diff = [torch.zeros(f.shape[-1], dtype=torch.float64) for f, _ in pairs]
            norm = [torch.zeros(f.shape[-1], dtype=torch.float64) for f, _ in pairs]
        for i, (f, g) in enumerate(pairs):
            diff[i] += (f - g).square().sum(dim=0)
            norm[i] += f.square().sum(dim=0)
    return [float((d / n.clamp_min(NORM_FLOOR ** 2)).sum() / d.numel()) for d, n in zip(diff, norm, strict=True)]
