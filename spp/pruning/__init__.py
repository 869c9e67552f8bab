"""Post-training pruning (magnitude, Wanda, SparseGPT, DS⊘T and plug-ins; unstructured and N:M) with a sequential
calibration engine and an on-disk cache.

N:M convention: N weights are KEPT in every group of M consecutive input weights of each row (``2:8`` = 75 %
sparse). Masks are bool with True = kept, keyed by the qualified module name (``model.layers.0.self_attn.q_proj``).
Each pruner is a folder of ``spp/pruning/pruners/`` (imported here, so every pruner is registered once
``spp.pruning`` is imported; ``spp.pruning.registry``).
"""

from spp.projections import ATTENTION_TARGETS, DEFAULT_TARGETS
from spp.pruning import pruners as _pruners  # noqa: F401 - registers the project's pruners
from spp.pruning.base import MatrixOutcome, Pruner
from spp.pruning.cache import get_or_prune
from spp.pruning.config import (
    CACHE_KEY,
    KEY_REASON,
    UNORDERED,
    CalibrationConfig,
    PruneJobConfig,
    PrunerConfig,
    SparsityConfig,
)
from spp.pruning.engine import PruneResult, prune_model
from spp.pruning.patterns import NMCheck, check_nm, sparsity_summary
from spp.pruning.registry import get_pruner, pruner_config, pruner_names, register_pruner
from spp.pruning.report import PruneReport
from spp.pruning.targets import current_masks, prunable_linears

__all__ = [
    "ATTENTION_TARGETS",
    "CACHE_KEY",
    "DEFAULT_TARGETS",
    "KEY_REASON",
    "CalibrationConfig",
    "MatrixOutcome",
    "NMCheck",
    "PruneJobConfig",
    "PruneReport",
    "PruneResult",
    "Pruner",
    "PrunerConfig",
    "SparsityConfig",
    "UNORDERED",
    "check_nm",
    "current_masks",
    "get_or_prune",
    "get_pruner",
    "prune_model",
    "pruner_config",
    "pruner_names",
    "register_pruner",
    "sparsity_summary",
    "prunable_linears",
]
