"""Lightning callbacks that run during training: adapter-only checkpoints and the sparsity audit."""

from spp.training.callbacks.adapter_checkpoint import AdapterCheckpoint, resolve_resume
from spp.training.callbacks.sparsity_audit import SparsityAuditCallback, SparsityViolation, audit

__all__ = ["AdapterCheckpoint", "SparsityAuditCallback", "SparsityViolation", "audit", "resolve_resume"]
