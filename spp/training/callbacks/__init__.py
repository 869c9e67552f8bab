"""Lightning callbacks of the training job."""

from spp.training.callbacks.adapter_checkpoint import AdapterCheckpoint, resolve_resume
from spp.training.callbacks.export import ExportCallback
from spp.training.callbacks.pruning import PruningCallback
from spp.training.callbacks.sparsity_audit import SparsityAuditCallback, SparsityViolation, audit

__all__ = [
    "AdapterCheckpoint",
    "ExportCallback",
    "PruningCallback",
    "SparsityAuditCallback",
    "SparsityViolation",
    "audit",
    "resolve_resume",
]
