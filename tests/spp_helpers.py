"""Shared helpers of the SPP layer tests (importable because ``tests/`` has no ``__init__.py``)."""

from __future__ import annotations

import torch


def nm_mask(shape: tuple[int, int], n: int, m: int, gen: torch.Generator) -> torch.Tensor:
    """Random N:M mask: in each group of m consecutive inputs of a row keep n."""
    rows, cols = shape
    scores = torch.rand(rows, cols // m, m, generator=gen, dtype=torch.float64)
    keep = scores.argsort(dim=-1, descending=True)[..., :n]
    mask = torch.zeros_like(scores).scatter_(-1, keep, 1.0)
    return mask.reshape(rows, cols)


def prune_2_4_(model: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Apply a random 2:4 mask to every decoder projection in place; return the zero patterns by name."""
    gen = torch.Generator().manual_seed(seed)
    zeros = {}
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1].endswith("_proj"):
                mod.weight.mul_(nm_mask(tuple(mod.weight.shape), 2, 4, gen).to(mod.weight.dtype))
                zeros[name] = mod.weight == 0
    return zeros
