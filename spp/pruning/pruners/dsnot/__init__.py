"""DS⊘T (``pruner=dsnot``, Zhang et al., ICLR 2024): training-free refinement of a Wanda / SparseGPT / magnitude
mask."""

from __future__ import annotations

from spp.pruning.pruners.dsnot.pruner import INITIAL_METHODS, DSnoT, DSnoTConfig
from spp.pruning.pruners.dsnot.rule import dsnot_refine, expected_error
from spp.pruning.registry import register_pruner

register_pruner("dsnot", DSnoTConfig, DSnoT)

__all__ = ["INITIAL_METHODS", "DSnoT", "DSnoTConfig", "dsnot_refine", "expected_error"]
