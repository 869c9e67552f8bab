"""Wanda: score S_ij = |W_ij| · ‖X_j‖₂, compared within each output row (or each N:M group)."""

from __future__ import annotations

import torch

from spp.pruning.config import SparsityConfig
from spp.pruning.patterns import mask_from_scores


def wanda_scores(weight: torch.Tensor, input_norm_sq: torch.Tensor) -> torch.Tensor:
    """S = |W| · sqrt(scaler_row) ∝ |W_ij| · ‖X_j‖₂ (the 1/N factor does not change rankings)."""
    if input_norm_sq.shape != (weight.shape[1],):
        raise ValueError(f"input norms of shape {tuple(input_norm_sq.shape)} do not fit weight {tuple(weight.shape)}")
    return weight.detach().abs().float() * input_norm_sq.float().sqrt().reshape(1, -1)


def wanda_mask(weight: torch.Tensor, input_norm_sq: torch.Tensor, sparsity: SparsityConfig) -> torch.Tensor:
    """Keep-mask of Wanda: every row loses exactly ``int(in * ratio)`` weights (unstructured), or N:M groups."""
    return mask_from_scores(wanda_scores(weight, input_norm_sq), sparsity, scope="row")
