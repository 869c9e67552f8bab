"""Post-training pruning (magnitude, Wanda, SparseGPT, DS⊘T, plug-ins; unstructured and N:M) with a sequential
calibration engine and an on-disk cache. N:M keeps N of every M consecutive input weights; masks are bool, True =
kept, keyed by qualified module name. Importing this registers every pruner in ``pruners/``."""

from spp.projections import current_masks
from spp.pruning import pruners as _pruners  # noqa: F401 - registers the project's pruners
from spp.pruning.base import MatrixOutcome, Pruner
from spp.pruning.config import CACHE_KEY, KEY_REASON, UNORDERED, CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import PruneResult, prune_model
from spp.pruning.patterns import check_nm, sparsity_summary
from spp.pruning.registry import pruner_config, register_pruner

__all__ = [
    "CACHE_KEY",
    "KEY_REASON",
    "CalibrationConfig",
    "MatrixOutcome",
    "PruneResult",
    "Pruner",
    "PrunerConfig",
    "SparsityConfig",
    "UNORDERED",
    "check_nm",
    "current_masks",
    "prune_model",
    "pruner_config",
    "register_pruner",
    "sparsity_summary",
]
