"""The one place a job's registry names become objects: the pruner, the adapter method, the reconstruction form.
Cheap (no model read); in ``spp.pruning`` so the engines below ``spp.training`` reach it without an import cycle."""

from __future__ import annotations

from spp.adapters.base import AdapterMethod
from spp.adapters.registry import get_method, method_names
from spp.errors import UserError
from spp.pruning.base import Pruner
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.registry import NO_PRUNING, get_pruner


def prunes(pruner: PrunerConfig, sparsity: SparsityConfig | None = None) -> bool:
    """Whether anything is pruned: a pruner other than ``none`` and (when given) a pattern that is not dense."""
    return pruner.name != NO_PRUNING and not (sparsity is not None and sparsity.is_dense)


def resolve_pruner(pruner: PrunerConfig, sparsity: SparsityConfig | None = None) -> Pruner | None:
    """The :class:`Pruner` that ``pruner`` names; ``None`` when nothing is pruned (:func:`prunes`)."""
    return get_pruner(pruner) if prunes(pruner, sparsity) else None


def resolve_adapter(name: str) -> AdapterMethod:
    """The adapter method registered as ``name`` (``adapter.name``)."""
    return get_method(name)


def training_forms() -> list[str]:
    """The adapter methods that can be a reconstruction form (those that train; plug-ins included)."""
    return [name for name in method_names() if get_method(name).trains]


def resolve_form(cfg: ReconstructConfig) -> AdapterMethod | None:
    """The adapter method ``reconstruct.form`` names; ``None`` when ``reconstruct=none``.
    Raises ``UserError`` for an unknown form or one that trains nothing."""
    return form_method(cfg.form) if cfg.enabled else None


def form_method(form: str) -> AdapterMethod:
    """The adapter method of reconstruction form ``form``, refused in one line when unknown or untrained."""
    try:
        method = get_method(form)
    except (KeyError, ValueError) as err:
        raise UserError(f"reconstruct.form={form!r} is not an adapter method ({err})",
                        f"set reconstruct.form to one of {training_forms()}", key="reconstruct.form") from err
    if not method.trains:
        raise UserError(f"reconstruct.form={form} trains nothing",
                        f"choose a form that trains ({', '.join(training_forms())}) or reconstruct=none",
                        key="reconstruct.form")
    return method
