"""``Choice``: the base of every choice field's Enum in the typed configs (its ``str`` is the bare value)."""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A config choice: compares equal to its value (``Impl.fused == "fused"``) and prints as it (``fused``)."""

    def __str__(self) -> str:
        return self.value
