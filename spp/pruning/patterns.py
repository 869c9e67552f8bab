"""Sparsity patterns: scores to keep-masks (**True = kept**), N:M checks and sparsity summaries.

N:M keeps N weights in every group of M consecutive input columns of each row (``2:4`` = 50 %, ``2:8`` = 75 %)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from spp.pruning.config import SparsityConfig


def check_layer_fits(name: str, weight_shape: tuple[int, ...] | torch.Size, sparsity: SparsityConfig) -> None:
    """Raise ``ValueError`` if the layer ``name`` cannot hold ``sparsity`` (in_features not a multiple of M)."""
    if sparsity.kind == "nm" and int(weight_shape[-1]) % int(sparsity.m) != 0:
        raise ValueError(
            f"layer {name} has in_features={int(weight_shape[-1])}, not a multiple of M={sparsity.m} required by "
            f"sparsity={sparsity.name}; choose another sparsity.m or drop the layer from pruner.targets"
        )


def prune_lowest_per_row(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """Keep-mask that zeros the ``int(cols * ratio)`` lowest scores of every row (ties by column index)."""
    k = int(scores.shape[1] * ratio)
    keep = torch.ones_like(scores, dtype=torch.bool)
    if k > 0:
        idx = torch.sort(scores, dim=1, stable=True).indices[:, :k]
        keep.scatter_(1, idx, False)
    return keep


def prune_lowest_global(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """Keep-mask that zeros the ``int(numel * ratio)`` lowest scores of the whole matrix (one threshold)."""
    return prune_lowest_per_row(scores.reshape(1, -1), ratio).view_as(scores)


def keep_top_n_of_m(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Keep the ``n`` highest scores in every group of ``m`` consecutive columns (ties: lower index pruned first)."""
    rows, cols = scores.shape  # cols is a multiple of m: check_layer_fits refused any other layer before pruning
    groups = scores.reshape(rows, cols // m, m)
    pruned = torch.sort(groups, dim=-1, stable=True).indices[..., : m - n]
    keep = torch.ones_like(groups, dtype=torch.bool).scatter_(-1, pruned, False)
    return keep.reshape(rows, cols)


def mask_from_scores(scores: torch.Tensor, sparsity: SparsityConfig, scope: str = "row") -> torch.Tensor:
    """Keep-mask from (out, in) scores, higher = more important; unstructured ``scope`` compares per ``row`` (Wanda,
    DS⊘T) or per ``matrix`` (magnitude)."""
    if sparsity.kind == "dense":
        return torch.ones_like(scores, dtype=torch.bool)
    if sparsity.kind == "nm":
        return keep_top_n_of_m(scores, *sparsity.nm_pair)
    if scope == "row":
        return prune_lowest_per_row(scores, sparsity.target_ratio)
    return prune_lowest_global(scores, sparsity.target_ratio)  # "matrix"; RIAConfig refuses any other pruner.scope


@dataclass
class NMCheck:
    """Result of an N:M audit, truthy when no group keeps more than N; ``exact_groups`` keep exactly N."""

    valid: bool
    violations: int
    groups: int
    exact_groups: int

    def __bool__(self) -> bool:
        return self.valid


def check_nm(mask_or_weight: torch.Tensor, n: int, m: int) -> NMCheck:
    """Audit an N:M pattern group by group on a bool keep-mask or a weight (nonzeros kept), shape (out, in)."""
    kept = mask_or_weight if mask_or_weight.dtype == torch.bool else mask_or_weight != 0
    kept = kept.reshape(-1, kept.shape[-1])
    if kept.shape[1] % m:
        raise ValueError(f"cannot audit N:M with M={m}: in_features={kept.shape[1]} is not a multiple of M")
    per_group = kept.reshape(kept.shape[0], -1, m).sum(-1)
    violations = int((per_group > n).sum())
    return NMCheck(violations == 0, violations, per_group.numel(), int((per_group == n).sum()))


def sparsity_summary(
    tensors: Mapping[str, torch.Tensor], n: int | None = None, m: int | None = None
) -> dict[str, Any]:
    """Per-layer and overall fraction of zeros, with an N:M audit when ``n`` and ``m`` are given.
    Returns ``{"layers": {name: {shape, zeros, numel, sparsity[, nm_valid, nm_violations]}}, "overall": {...}}``."""
    layers: dict[str, dict[str, Any]] = {}
    zeros_total = numel_total = violations_total = 0
    for name, tensor in tensors.items():
        zeros = int((~tensor).sum()) if tensor.dtype == torch.bool else int((tensor == 0).sum())  # False = pruned
        row: dict[str, Any] = {
            "shape": list(tensor.shape),
            "zeros": zeros,
            "numel": tensor.numel(),
            "sparsity": zeros / max(tensor.numel(), 1),
        }
        if n is not None and m is not None:
            audit = check_nm(tensor, n, m)
            row["nm_valid"] = audit.valid
            row["nm_violations"] = audit.violations
            violations_total += audit.violations
        layers[name] = row
        zeros_total += zeros
        numel_total += tensor.numel()
    overall: dict[str, Any] = {
        "layers": len(layers),
        "zeros": zeros_total,
        "numel": numel_total,
        "sparsity": zeros_total / max(numel_total, 1),
    }
    if n is not None and m is not None:
        overall["nm"] = f"{n}:{m}"
        overall["nm_valid"] = violations_total == 0
        overall["nm_violations"] = violations_total
    return {"layers": layers, "overall": overall}
