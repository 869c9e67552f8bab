"""Magnitude pruning: score |W_ij|, one threshold per matrix (unstructured) or per group (N:M)."""

from __future__ import annotations

import torch

from spp.pruning.config import SparsityConfig
from spp.pruning.patterns import mask_from_scores


def magnitude_mask(weight: torch.Tensor, sparsity: SparsityConfig) -> torch.Tensor:
    """Keep-mask of magnitude pruning: unstructured prunes the ``int(numel * ratio)`` smallest |W| of the matrix (as
    the Wanda and SparseGPT repositories); N:M keeps the N largest |W| per group."""
    return mask_from_scores(weight.detach().abs().float(), sparsity, scope="matrix")
