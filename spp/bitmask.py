"""Pruning masks stored one bit per weight (row-wise packed ``uint8``, m x ceil(n / 8) bytes), the one format of
the cache, the export audit and the mask-keeping adapters; rows ``lo:hi`` unpack on their own."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(8, dtype=torch.uint8, device=device)


def pack_rows(mask: torch.Tensor) -> torch.Tensor:
    """Pack a 2-D bool mask (m x n) into ``uint8`` (m x ceil(n / 8)); bit ``j`` of byte ``c`` is column 8c + j."""
    if mask.dim() != 2:
        raise ValueError(f"pack_rows: expected a 2-D mask, got shape {tuple(mask.shape)}")
    m, n = mask.shape
    bits = F.pad(mask.to(torch.uint8), (0, (-n) % 8)).view(m, -1, 8)
    return (bits << _shifts(mask.device)).sum(dim=-1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Rows of ``packed`` x ``n`` as 0/1 ``uint8`` (a multiplier: one kernel, no negation)."""
    bits = (packed.unsqueeze(-1) >> _shifts(packed.device)) & 1
    return bits.view(packed.shape[0], -1)[:, :n]


def unpack_rows(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_rows`: the bool mask (rows of ``packed`` x ``n``)."""
    return unpack_bits(packed, n).bool()


def checked_mask(name: str, mask: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The pruning mask of layer ``name`` as bool on the weight's device; ``ValueError`` on a shape mismatch, values
    other than 0/1, or a non-zero pruned weight (not this model's masks)."""
    if tuple(mask.shape) != tuple(weight.shape):
        raise ValueError(f"mask for {name!r} has shape {tuple(mask.shape)} but the weight is "
                         f"{tuple(weight.shape)} (out, in); pass the pruning masks of this model")
    if mask.dtype != torch.bool:
        if not mask.is_meta and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"mask for {name!r} has dtype {mask.dtype} with values other than 0/1; give a bool mask")
        mask = mask != 0
    mask = mask.to(weight.device)
    if not weight.is_meta:
        revived = int((weight.detach()[~mask] != 0).sum())
        if revived:
            raise ValueError(f"mask for {name!r} prunes {revived} weight(s) that are non-zero: prune the model with "
                             "these masks first (the masks must be the pruning masks of this model)")
    return mask
