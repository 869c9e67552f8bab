"""SparseGPT (``pruner=sparsegpt``, Frantar & Alistarh, 2023): OBS pruning with weight reconstruction."""

from __future__ import annotations

from spp.pruning.pruners.sparsegpt.pruner import SparseGPT, SparseGPTConfig
from spp.pruning.pruners.sparsegpt.rule import inverse_hessian_factor, sparsegpt_prune
from spp.pruning.registry import register_pruner

register_pruner("sparsegpt", SparseGPTConfig, SparseGPT)

__all__ = ["SparseGPT", "SparseGPTConfig", "inverse_hessian_factor", "sparsegpt_prune"]
