"""Magnitude pruning (``pruner=magnitude``): keep the largest |W|; no calibration."""

from __future__ import annotations

from spp.pruning.pruners.magnitude.pruner import Magnitude, MagnitudeConfig
from spp.pruning.pruners.magnitude.rule import magnitude_mask
from spp.pruning.registry import register_pruner

register_pruner("magnitude", MagnitudeConfig, Magnitude)

__all__ = ["Magnitude", "MagnitudeConfig", "magnitude_mask"]
