"""Pruners by name: each registers its config dataclass and its :class:`~spp.pruning.base.Pruner` here.

``register_pruner(name, config_cls, pruner_cls)`` (called by the ``__init__`` of a pruner's folder:
``spp/pruning/pruners/<name>/``, or a plug-in's named by ``SPP_PLUGINS``) records both and stores the config class
in Hydra's ConfigStore as ``pruner/<name>_schema``; the option ``conf/pruner/<name>.yaml`` starts with
``defaults: [<name>_schema, _self_]``, so the composed ``pruner`` node is typed by that class (its fields take
overrides, a misspelled one is refused). The project's own pruners are registered when ``spp.pruning`` is imported
(``spp/pruning/pruners/__init__.py``). ``none`` (no pruning) has no class: its config is the base
:class:`~spp.pruning.config.PrunerConfig`.
"""

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

    Registering the same classes again (a re-import) is a no-op.

    Raises:
        TypeError: the classes are not a ``PrunerConfig`` dataclass and a ``Pruner``, or a field left out of the
            cache key gives no reason.
        UserError: ``config_cls.name`` does not default to ``name``, ``name`` is taken by other classes (naming
            both files), or is ``none``.
    """
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


def pruner_names() -> list[str]:
    """Every registered pruner's name, sorted (``none`` not included)."""
    return PRUNERS.names()


def pruner_class(name: str) -> type[Pruner]:
    """The :class:`Pruner` subclass registered as ``name``.

    Raises:
        UserError: ``none`` or an unknown name (lists the known ones).
    """
    return PRUNERS.get(name)


def resolve_config(cfg: PrunerConfig) -> PrunerConfig:
    """``cfg`` as its pruner's own config class: a base ``PrunerConfig(name="sparsegpt")`` (written in code) becomes
    ``SparseGPTConfig`` with the shared fields copied and the rest at their defaults; ``none`` stays as it is.

    Raises:
        ValueError: an unknown pruner name, or a value the pruner's config refuses.
    """
    if cfg.name == NO_PRUNING:
        return cfg
    config_cls = pruner_class(cfg.name).config_class
    if isinstance(cfg, config_cls):
        return cfg
    shared = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(PrunerConfig)}
    return config_cls(**shared)


def pruner_config(name: str, **settings: Any) -> PrunerConfig:
    """The config of pruner ``name`` with ``settings`` (``pruner_config("sparsegpt", blocksize=64)``).

    Raises:
        ValueError: an unknown name or a bad value; ``TypeError``: a setting the pruner's config does not have.
    """
    if name == NO_PRUNING:
        return PrunerConfig(name=name, **settings)
    return pruner_class(name).config_class(**settings)


def get_pruner(cfg: PrunerConfig) -> Pruner:
    """The pruner ``cfg.name`` names, built from ``cfg`` (:func:`resolve_config`).

    Raises:
        UserError: ``none`` or an unknown name (lists the known ones).
    """
    cfg = resolve_config(cfg)
    return pruner_class(cfg.name)(cfg)


def needs_calibration(cfg: PrunerConfig, sparsity: SparsityConfig | None = None) -> bool:
    """Whether pruner ``cfg`` needs calibration activations (``none``: no); a layer-wise ``sparsity`` (OWL) needs
    them whatever the pruner."""
    if cfg.name == NO_PRUNING:
        return False
    return pruner_class(cfg.name).needs_calibration or (sparsity is not None and sparsity.layerwise != "none")
