"""The per-window loss of a block against the dense block's outputs (``reconstruct.loss``)."""

from __future__ import annotations

import torch

from spp.pruning.reconstruction.config import ReconstructLoss

EPS = 1e-12
"""Floor of ‖h_dense‖² in the normalised loss (a token whose dense output is exactly zero)."""


def window_losses(out: torch.Tensor, target: torch.Tensor, loss: ReconstructLoss | str) -> torch.Tensor:
    """One loss per window, shape ``(batch,)``, in float32 or wider: ``mse`` over tokens and features, or ``nmse``
    ``‖h − h_dense‖² / ‖h_dense‖²`` per token (scale-free, so large activations do not dominate)."""
    out, target = _wide(out), _wide(target)
    sq = (out - target).pow(2)
    if ReconstructLoss(loss) is ReconstructLoss.mse:
        return sq.flatten(1).mean(dim=1)
    per_token = sq.sum(dim=-1) / target.pow(2).sum(dim=-1).clamp_min(EPS)
    return per_token.flatten(1).mean(dim=1)


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()
