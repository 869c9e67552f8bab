"""RIA (``pruner=ria``, Zhang et al., ICLR 2024): relative importance and activations, channel reallocation for N:M."""

from __future__ import annotations

from spp.pruning.pruners.ria.pruner import RIA, RIAConfig
from spp.pruning.pruners.ria.rule import reallocation_order, ria_mask, ria_scores
from spp.pruning.registry import register_pruner

register_pruner("ria", RIAConfig, RIA)

__all__ = ["RIA", "RIAConfig", "reallocation_order", "ria_mask", "ria_scores"]
