"""Post-training pruning (magnitude, Wanda, SparseGPT, DS⊘T, plug-ins; unstructured and N:M) with a sequential
calibration engine and an on-disk cache. N:M keeps N of every M consecutive input weights; masks are bool, True =
kept, keyed by qualified module name. Importing this registers every pruner in ``pruners/``."""

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
