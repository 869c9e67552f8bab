"""Wanda (``pruner=wanda``, Sun et al., 2024): keep the largest |W_ij| · ‖X_j‖₂ per output row."""

from __future__ import annotations

from spp.pruning.pruners.wanda.pruner import Wanda, WandaConfig
from spp.pruning.pruners.wanda.rule import wanda_mask, wanda_scores
from spp.pruning.registry import register_pruner

register_pruner("wanda", WandaConfig, Wanda)

__all__ = ["Wanda", "WandaConfig", "wanda_mask", "wanda_scores"]
