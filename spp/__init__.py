"""spp: sparsity-preserved parameter-efficient fine-tuning of pruned LLMs (SPP, ICML 2024).

Public names are imported on first use, so ``import spp`` loads nothing and a command can set environment defaults
(``TQDM_DISABLE``) before torch, transformers or tqdm load."""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES = {
    "count_parameters": "spp.adapters.base",
    **dict.fromkeys(["DEFAULT_IMPL", "IMPLS", "SPPLinear", "adapter_state_dict", "inject", "load_adapter",
                     "merge_and_unload", "read_adapter_config", "save_adapter", "set_impl", "spp_layers"],
                    "spp.adapters.methods.spp"),
    "DEFAULT_TARGETS": "spp.projections",
    "__version__": "spp.version",
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    """The public name (or subpackage) ``name``, imported now (PEP 562)."""
    if name not in _SOURCES:
        try:  # a subpackage (``spp.adapters``) as an attribute, as when this file imported them all
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(_SOURCES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
