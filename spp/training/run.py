"""What a job resolved, once: :class:`Run` (frozen), built by :func:`build_run` at the start of ``run_job``:
the resolved methods (:func:`resolve_methods`, no weight read) and the pruning identity (:func:`pruning_identity`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spp.adapters.base import AdapterMethod
from spp.pruning.base import Pruner
from spp.pruning.resolve import resolve_adapter, resolve_form, resolve_pruner
from spp.training.objectives import Objective, build_objective
from spp.training.strategies import decoder_layer_class


@dataclass(frozen=True)
class Methods:
    """A job's registry names resolved (:func:`resolve_methods`); ``None`` where the job has none (``pruner=none``
    or a dense pattern, ``prune.py``'s adapter and objective, ``form`` unless ``reconstruct=blockwise``)."""

    pruner: Pruner | None
    adapter: AdapterMethod | None = None
    objective: Objective | None = None
    form: AdapterMethod | None = None

    @property
    def trains(self) -> bool:
        """Whether the adapter method trains anything (``adapter=none`` does not)."""
        return self.adapter is not None and self.adapter.trains

    @property
    def keeps_dense(self) -> bool:
        """Whether pruning keeps a frozen dense copy for the objective (a teacher, and something trains)."""
        return self.trains and self.objective is not None and self.objective.needs_teacher


def resolve_methods(job: Any) -> Methods:
    """The objects ``job``'s names stand for (cheap: no model is read).

    Raises:
        UserError: an unknown pruner, adapter method or reconstruction form (each lists the known ones).
    """
    adapter = getattr(job, "adapter", None)
    objective = getattr(job, "objective", None)
    method = resolve_adapter(adapter.name) if adapter is not None else None
    built = (build_objective(objective, decoder_layer_class(job.model.decoder_layer_cls))
             if method is not None and objective is not None else None)
    return Methods(resolve_pruner(job.pruner, job.sparsity), method, built, resolve_form(job.reconstruct))


@dataclass(frozen=True)
class PruningIdentity:
    """What identifies the pruned weights: the model's identity and, when something is pruned, the pruning cache
    key (``key``, its sha256 ``digest``) and the reconstruction's (``reconstruction``: ``(key, digest)``)."""

    model: str
    key: dict[str, Any] | None = None
    digest: str | None = None
    reconstruction: tuple[dict[str, Any], str] | None = None

    @property
    def keys(self) -> tuple[tuple[dict[str, Any], str], tuple[dict[str, Any], str] | None] | None:
        """``((pruning key, digest), reconstruction (key, digest) or None)``; ``None`` when nothing is pruned."""
        return None if self.key is None else ((self.key, self.digest), self.reconstruction)

    @property
    def pruned_weights(self) -> str:
        """What identifies the pruned weights in the perplexity cache: the key's digest (the model's identity when
        nothing is pruned)."""
        return self.digest if self.digest is not None else self.model


def pruning_identity(job: Any, form: AdapterMethod | None = None) -> PruningIdentity:
    """The model identity and cache keys of ``job`` (reads the calibration file's sha256 when the pruner needs one;
    ``form``: the resolved reconstruction form, or None)."""
    from spp.models.loading import model_identity  # start-up time: a preflight refusal never loads transformers
    from spp.pruning.reconstruction.cache import pruning_keys
    from spp.pruning.resolve import prunes

    if not prunes(job.pruner, job.sparsity):
        return PruningIdentity(model_identity(job.model))
    (key, digest), rebuilt = pruning_keys(job.model, job.pruner, job.sparsity, job.calibration, job.reconstruct,
                                          job.data_dir, form)
    return PruningIdentity(key["model"], key, digest, rebuilt)


@dataclass(frozen=True)
class Run:
    """What one job resolved, built once (:func:`build_run`) and read by every phase: the typed ``job``, its
    ``methods``, ``run_dir`` and the pruning (and reconstruction) cache ``identity``."""

    job: Any
    methods: Methods
    run_dir: Path
    identity: PruningIdentity


def build_run(job: Any, run_dir: Path, methods: Methods | None = None) -> Run:
    """The job's :class:`Run`: ``methods`` (resolved here when not given) and the identity of its weights."""
    methods = methods if methods is not None else resolve_methods(job)
    return Run(job, methods, Path(run_dir), pruning_identity(job, methods.form))
