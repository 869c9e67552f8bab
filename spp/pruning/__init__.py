"""Post-training pruning (magnitude, Wanda, SparseGPT, DS⊘T; unstructured and N:M) with a sequential
calibration engine and an on-disk cache.

N:M convention: N weights are KEPT in every group of M consecutive input weights of each row (``2:8`` = 75 %
sparse). Masks are bool with True = kept, keyed by the qualified module name (``model.layers.0.self_attn.q_proj``).
"""

from spp.pruning.cache import get_or_prune
from spp.pruning.config import (
    ATTENTION_TARGETS,
    DEFAULT_TARGETS,
    CalibrationConfig,
    PruneJobConfig,
    PrunerConfig,
    SparsityConfig,
)
from spp.pruning.engine import PruneResult, prune_model
from spp.pruning.patterns import NMCheck, check_nm, sparsity_summary
from spp.pruning.report import PruneReport
from spp.pruning.targets import current_masks, target_linears

__all__ = [
    "ATTENTION_TARGETS",
    "DEFAULT_TARGETS",
    "CalibrationConfig",
    "NMCheck",
    "PruneJobConfig",
    "PruneReport",
    "PruneResult",
    "PrunerConfig",
    "SparsityConfig",
    "check_nm",
    "current_masks",
    "get_or_prune",
    "prune_model",
    "sparsity_summary",
    "target_linears",
]
