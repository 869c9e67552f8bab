"""Turn a dataclass, a mapping or an OmegaConf node into one of the pruning config dataclasses."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

T = TypeVar("T")


def as_config(cls: type[T], obj: Any, key: str) -> T:
    """Return ``obj`` as a ``cls`` instance.

    Raises:
        ValueError: unknown fields, naming the config group ``key`` and the valid fields.
    """
    if isinstance(obj, cls):
        return obj
    if isinstance(obj, DictConfig):
        obj = OmegaConf.to_container(obj, resolve=True)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if not isinstance(obj, Mapping):
        raise ValueError(f"{key} must be a {cls.__name__} or a mapping, got {type(obj).__name__}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(obj) - fields)
    if unknown:
        raise ValueError(f"unknown {key} key(s) {unknown}; valid keys: {sorted(fields)}")
    return cls(**dict(obj))
