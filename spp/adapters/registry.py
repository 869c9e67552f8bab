"""The adapter registry: ``adapter.name`` -> the ``METHOD`` of ``spp/adapters/methods/<name>.py``.

A new adapter method is one module there (exposing ``METHOD``, an :class:`~spp.adapters.base.AdapterMethod`) plus
one YAML under ``conf/adapter/``.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from spp.adapters.base import AdapterMethod, ExternalParameters, Masks, count_parameters
from spp.adapters.config import AdapterConfig, method_names


def get_method(name: str) -> AdapterMethod:
    """The registered method called ``name``.

    Raises:
        ValueError: no such method (lists the registered ones).
    """
    if name not in method_names():
        raise ValueError(f"adapter.name={name!r}: use one of {list(method_names())}")
    return importlib.import_module(f"spp.adapters.methods.{name}").METHOD


def apply_adapter(model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, list[str]]:
    """Attach the configured adapter and freeze everything else.

    Returns:
        ``(model, trainable parameter names)``; the model object may differ when the method wraps it.

    Raises:
        ValueError: a trainable method whose injection created no trainable parameter (names ``adapter.targets``).
    """
    method = get_method(cfg.name)
    model = method.inject(model, cfg, masks)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if method.trains and not trainable:
        raise ValueError(f"adapter.targets={list(cfg.targets)} matched no linear layer of the model; "
                         "fix adapter.targets")
    return model, trainable


def merge_adapter(model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
    """Fold the adapter into the weights (the method's merge); returns a plain HF model and merge statistics."""
    return get_method(cfg.name).merge(model, cfg, masks)


def external_parameters(model: nn.Module, name: str | None = None) -> ExternalParameters:
    """The ``(reader, parameter)`` pairs of method ``name`` (:meth:`AdapterMethod.external_parameters`), or of every
    registered method when ``None`` (each finds only its own layers), without duplicates."""
    names = [name] if name is not None else list(method_names())
    pairs: ExternalParameters = []
    seen: set[tuple[int, int]] = set()
    for method in names:
        for reader, param in get_method(method).external_parameters(model):
            if (id(reader), id(param)) not in seen:
                seen.add((id(reader), id(param)))
                pairs.append((reader, param))
    return pairs


__all__ = ["AdapterMethod", "apply_adapter", "count_parameters", "external_parameters", "get_method", "merge_adapter"]
