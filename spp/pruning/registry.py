"""Pruners by name: each registers its config dataclass and its :class:`~spp.pruning.base.Pruner` here.
The config class is stored as Hydra schema ``pruner/<name>_schema`` so the composed ``pruner`` node is typed (a
misspelled key is refused). ``none`` has no class: its config is the base ``PrunerConfig``."""

from __future__ import annotations

import dataclasses
from typing import Any

from spp.errors import UserError
from spp.pruning.base import Pruner
from spp.pruning.config import CACHE_KEY, KEY_REASON, PrunerConfig, SparsityConfig
from spp.registry import Registry

NO_PRUNING = "none"
"""The ``pruner=none`` name: nothing is pruned, no cache entry."""


def _unknown(name: str, known: list[str]) -> UserError:
    return UserError(f"pruner.name={name!r} is not a pruner", f"choose one of {known} (pruner=<name>), or none; a "
                     "plug-in's pruner needs its folder in SPP_PLUGINS", key="pruner.name")


PRUNERS: Registry[type[Pruner]] = Registry("pruner", "pruner.name", group="pruner", unknown=_unknown)
"""Every pruner's class by name (its config class is the class's ``config_class``)."""


def register_pruner(name: str, config_cls: type[PrunerConfig], pruner_cls: type[Pruner]) -> None:
    """Register pruner ``name`` (its config dataclass and its class) and store ``pruner/<name>_schema``.
    Re-registering the same classes is a no-op; ``TypeError``/``UserError`` name bad classes, names or key fields."""
    if not (isinstance(config_cls, type) and issubclass(config_cls, PrunerConfig)
            and dataclasses.is_dataclass(config_cls)):
        raise TypeError(f"pruner {name!r}: its config must be a dataclass subclass of PrunerConfig, not {config_cls}")
    if not (isinstance(pruner_cls, type) and issubclass(pruner_cls, Pruner)):
        raise TypeError(f"pruner {name!r}: {pruner_cls} is not a subclass of spp.pruning.base.Pruner")
    for f in dataclasses.fields(config_cls):
        if f.metadata.get(CACHE_KEY, True) is not True and not f.metadata.get(KEY_REASON):
            raise TypeError(f"pruner {name!r}: field {f.name} is left out of the cache key without a "
                            f"metadata[{KEY_REASON!r}] saying why")
    if name == NO_PRUNING:
        raise UserError(f"pruner name {NO_PRUNING!r} means no pruning", "choose another name")
    PRUNERS.register(name, pruner_cls, config_cls)
    if PRUNERS.get(name) is pruner_cls:  # not a second import of the same file under another module name
        pruner_cls.name, pruner_cls.config_class = name, config_cls


def resolve_config(cfg: PrunerConfig) -> PrunerConfig:
    """``cfg`` as its pruner's own config class (shared fields copied, the rest default); ``none`` stays as is.
    Raises ``ValueError`` for an unknown name or a value the pruner's config refuses."""
    if cfg.name == NO_PRUNING:
        return cfg
    config_cls = PRUNERS.get(cfg.name).config_class
    if isinstance(cfg, config_cls):
        return cfg
    shared = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(PrunerConfig)}
    return config_cls(**shared)


def pruner_config(name: str, **settings: Any) -> PrunerConfig:
    """The config of pruner ``name`` with ``settings`` (``pruner_config("sparsegpt", blocksize=64)``)."""
    if name == NO_PRUNING:
        return PrunerConfig(name=name, **settings)
    return PRUNERS.get(name).config_class(**settings)


def get_pruner(cfg: PrunerConfig) -> Pruner:
    """The pruner ``cfg.name`` names, built from ``cfg``; ``UserError`` for ``none`` or an unknown name."""
    cfg = resolve_config(cfg)
    return PRUNERS.get(cfg.name)(cfg)


def needs_calibration(cfg: PrunerConfig, sparsity: SparsityConfig | None = None) -> bool:
    """Whether pruner ``cfg`` needs calibration activations (``none``: no); a layer-wise ``sparsity`` (OWL) needs
    them whatever the pruner."""
    if cfg.name == NO_PRUNING:
        return False
    return PRUNERS.get(cfg.name).needs_calibration or (sparsity is not None and sparsity.layerwise != "none")
