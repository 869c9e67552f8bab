"""RIA (Zhang et al., ICLR 2024): relative importance times activations (Eqs. 2-3), with channel reallocation
for N:M (§3.2). Unstructured compares the whole matrix (the reference's default) or each row (``--per_outneuron``)."""

from __future__ import annotations

import torch

from spp.pruning.config import SparsityConfig
from spp.pruning.patterns import keep_top_n_of_m, mask_from_scores


def _share(w: torch.Tensor, dim: int) -> torch.Tensor:
    """``w`` divided by its sums along ``dim`` (an all-zero line gets share 0, not NaN)."""
    total = w.sum(dim, keepdim=True)
    return torch.where(total > 0, w / total.clamp_min(torch.finfo(w.dtype).tiny), torch.zeros_like(w))


def ria_scores(weight: torch.Tensor, input_norm_sq: torch.Tensor, a: float) -> torch.Tensor:
    """RIA's ``S = RI · (‖X_j‖₂)^a`` with ``RI_ij = |W_ij|/Σ_col + |W_ij|/Σ_row`` (fp32, shape of ``weight``)."""
    if input_norm_sq.shape != (weight.shape[1],):
        raise ValueError(f"input norms of shape {tuple(input_norm_sq.shape)} do not fit weight {tuple(weight.shape)}")
    w = weight.detach().abs().float()
    relative = _share(w, 0) + _share(w, 1)
    return relative * input_norm_sq.float().sqrt().pow(a).reshape(1, -1)


def reallocation_order(scores: torch.Tensor, m: int) -> torch.Tensor:
    """Heuristic channel reallocation: column order (new -> old) dealing columns sorted by score into the m slots,
    ascending for even slots and descending for odd ones, so each group mixes weak and strong channels."""
    cols = scores.shape[1]
    if cols % m:
        raise ValueError(f"channel reallocation needs the number of columns ({cols}) to be a multiple of M={m}")
    ranked = torch.sort(scores.sum(0), stable=True).indices
    order = torch.empty_like(ranked)
    for j in range(m):
        part = ranked[cols * j // m: cols * (j + 1) // m]
        order[j::m] = part if j % 2 == 0 else part.flip(0)
    return order


def ria_mask(scores: torch.Tensor, sparsity: SparsityConfig, scope: str = "matrix",
             permute: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Keep-mask from RIA scores and, with ``permute`` (N:M only), the column order under which it is N:M.
    The mask is then N:M in ``mask[:, order]``: the deployment permutes each matrix's input channels by ``order``."""
    n, m = sparsity.nm_pair
    if not permute or m is None:
        return mask_from_scores(scores, sparsity, scope=scope), None
    order = reallocation_order(scores, m)
    keep = torch.empty_like(scores, dtype=torch.bool)
    keep[:, order] = keep_top_n_of_m(scores[:, order], n, m)
    return keep, order
