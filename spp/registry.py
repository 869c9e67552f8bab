"""One shape for every registry by name: pruners, adapter methods, training objectives and evaluation tasks.

Re-registering the same entry (a re-import under another module name) is a no-op; conflicts are one-line errors."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from spp.errors import UserError

T = TypeVar("T")

Unknown = Callable[[str, list[str]], UserError]
"""Builds the refusal of an unknown name from the name and the known names."""


def defined_in(obj: Any) -> str:
    """The file that defines ``obj`` (its class for an instance), or its qualified name when there is none."""
    target = obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)
    try:
        return inspect.getsourcefile(target) or f"{target.__module__}.{target.__qualname__}"
    except TypeError:  # a built-in class
        return f"{target.__module__}.{target.__qualname__}"


def config_name(config_cls: type | None) -> str | None:
    """The default of a config dataclass's ``name`` field (``None``: no such field, or no default)."""
    fields = dataclasses.fields(config_cls) if config_cls is not None and dataclasses.is_dataclass(config_cls) else ()
    default = next((f.default for f in fields if f.name == "name"), dataclasses.MISSING)
    return None if default is dataclasses.MISSING else str(default)


def _identity(entry: Any) -> tuple[str, str]:
    """What makes two registrations the same entry: its defining file and qualified name."""
    target = entry if inspect.isclass(entry) or inspect.isfunction(entry) else type(entry)
    return defined_in(entry), getattr(target, "__qualname__", repr(target))


class Registry(Generic[T]):
    """Entries by name; ``kind`` names an entry in messages, ``key`` is the config key naming it (``pruner.name``),
    ``group`` the Hydra group storing ``<name>_schema`` (``None``: none), ``unknown`` builds the unknown-name error."""

    def __init__(self, kind: str, key: str, group: str | None = None, unknown: Unknown | None = None) -> None:
        self.kind, self.key, self.group = kind, key, group
        self.unknown = unknown or self._unknown
        self.entries: dict[str, T] = {}
        self.sources: dict[str, str] = {}

    def register(self, name: str | None, entry: T, config_cls: type | None = None,
                 source: str | None = None) -> str:
        """Register ``entry`` under ``name`` (``None``: the config's ``name`` default); returns the name.

        ``source``: the file named when the name is taken (default: the file defining ``entry``)."""
        default = config_name(config_cls)
        name = name or default
        if not name:
            label = (entry if inspect.isclass(entry) else type(entry)).__name__
            raise UserError(f"{self.kind} {label} has no name",
                            f"give its config a `name` field defaulting to the option's name ({defined_in(entry)})")
        if default is not None and default != name and config_cls is not None:
            raise UserError(f"{self.kind} {name!r}: its config {config_cls.__name__}.name defaults to {default!r}, "
                            f"not {name!r}", f"set `name: str = {name!r}` in {config_cls.__name__} "
                            f"({defined_in(config_cls)})")
        source = source or defined_in(entry)
        held = self.entries.get(name)
        if held is not None:
            if held is entry or _identity(held) == _identity(entry) and self.sources[name] == source:
                return name
            raise UserError(f"{self.kind} {name!r} is registered twice: by {self.sources[name]} and by {source}",
                            "rename one of them (its `name` and its option's YAML)")
        self.entries[name], self.sources[name] = entry, source
        if self.group is not None and config_cls is not None:
            from hydra.core.config_store import ConfigStore

            ConfigStore.instance().store(group=self.group, name=f"{name}_schema", node=config_cls)
        return name

    def get(self, name: str) -> T:
        """The entry registered as ``name``; ``UserError`` listing the known names otherwise."""
        if name not in self.entries:
            raise self.unknown(name, self.names())
        return self.entries[name]

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self.entries)

    def _unknown(self, name: str, known: list[str]) -> UserError:
        return UserError(f"{self.key}={name!r} is not a registered {self.kind}", f"use one of {known}, or name "
                         "its plug-in folder in SPP_PLUGINS", key=self.key)
