"""How the lab's tables name and order the methods: presentation, kept here so that ``spp`` methods do not know
their tables. A method not listed (a plug-in) is named by its registered name and comes after the listed ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spp.adapters.registry import get_method, method_names

ADAPTERS: dict[str, tuple[str, int]] = {
    "none": ("pruned", 0),
    "spp": ("SPP", 1),
    "sparse_lora": ("SparsePEFT", 2),
    "lora": ("LoRA*", 3),
    "masked_full": ("masked full FT", 4),
    "scale_lora": ("ScaleLoRA", 5),
    "norms": ("norms only", 6),
    "losa": ("LoSA", 7),
}
"""Adapter method -> (its name in the tables, its place among them)."""
UNLISTED_ORDER = 100
"""The place of a method :data:`ADAPTERS` does not list."""

KEPT_WEIGHTS_TRAINED = ("masked_full",)
"""Methods whose trained parameters are the kept weights of the adapted projections (the summary's
``merge.kept_params``), not the tensors that require grad (``params.trainable``, which counts the pruned ones too)."""

PRUNERS: dict[str, tuple[str, int]] = {
    "none": ("None", 0),
    "sparsegpt": ("SparseGPT", 1),
    "wanda": ("Wanda", 2),
    "magnitude": ("Magnitude", 3),
    "dsnot": ("dsnot", 4),
}
"""Pruner -> (its name in the tables, its row order)."""
UNLISTED_RANK = 9
"""The row order of a pruner :data:`PRUNERS` does not list."""

PRUNER_VARIANTS: dict[str, tuple[str, str, str]] = {"dsnot": ("initial_method", "wanda", "{}+DS⊘T")}
"""Pruner -> (the setting that tells its rows apart, that setting's default, the row label around the label of the
pruner the setting names): DS⊘T's rows are ``Wanda+DS⊘T``, ``SparseGPT+DS⊘T``, ..."""


def adapter_label(name: str) -> str:
    """``spp`` -> ``SPP``; an unlisted method -> its name."""
    return ADAPTERS.get(name, (name, UNLISTED_ORDER))[0]


def adapters_in_table_order() -> list[str]:
    """Every registered adapter method (plug-ins loaded included) in the tables' order, then by name."""
    return sorted(method_names(), key=lambda n: (ADAPTERS.get(n, ("", UNLISTED_ORDER))[1], n))


def method_labels() -> dict[str, str]:
    """Adapter name -> its name in the tables, in table order: every registered method, plug-ins included."""
    return {name: adapter_label(name) for name in adapters_in_table_order()}


def trained_methods() -> tuple[str, ...]:
    """The registered methods that train, in table order."""
    return tuple(n for n in adapters_in_table_order() if get_method(n).trains)


def trained_from_summary(adapter: str, summary: Mapping[str, Any]) -> int:
    """Parameters training can change, read from a run's ``summary.json`` (:data:`KEPT_WEIGHTS_TRAINED`, else its
    ``params.trainable``)."""
    trainable = int((summary.get("params") or {}).get("trainable") or 0)
    if adapter in KEPT_WEIGHTS_TRAINED:
        return int((summary.get("merge") or {}).get("kept_params") or trainable)
    return trainable


def pruner_label(name: str) -> str:
    """``wanda`` -> ``Wanda``; an unlisted pruner -> its name."""
    return PRUNERS.get(name, (name, UNLISTED_RANK))[0]


def pruner_rank(name: str) -> int:
    """A pruner's row order (:data:`PRUNERS`; :data:`UNLISTED_RANK` when unlisted)."""
    return PRUNERS.get(name, (name, UNLISTED_RANK))[1]


def pruner_variant(settings: Mapping[str, Any]) -> str | None:
    """What else tells a pruner's rows apart, from a run's ``pruner`` settings (DS⊘T: its initial method)."""
    key = PRUNER_VARIANTS.get(str(settings.get("name")))
    value = settings.get(key[0]) if key else None
    return None if value is None else str(value)


def pruner_row_label(name: str, variant: str | None = None) -> str:
    """A pruner's name in a table row (``Wanda``; DS⊘T: ``Wanda+DS⊘T``)."""
    if name not in PRUNER_VARIANTS:
        return pruner_label(name)
    _key, default, form = PRUNER_VARIANTS[name]
    return form.format(pruner_label(variant or default))
