"""Adapters on a pruned model, laid out as peft's tuners: interface, shared config, registry, one package per method.

Importing the package registers the built-in methods, so Hydra can compose ``adapter=<name>``.
"""

from spp.adapters.base import AdapterMethod, ParamCounts, count_parameters
from spp.adapters.config import AdapterConfig
from spp.adapters.registry import (
    apply_adapter,
    get_method,
    load_builtin,
    make_config,
    merge_adapter,
    method_names,
    register,
)
from spp.projections import DEFAULT_TARGETS

load_builtin()  # every built-in method registers itself and its Hydra schema (adapter/<name>_schema) on import

__all__ = [
    "DEFAULT_TARGETS",
    "AdapterConfig",
    "AdapterMethod",
    "ParamCounts",
    "apply_adapter",
    "count_parameters",
    "get_method",
    "make_config",
    "merge_adapter",
    "method_names",
    "register",
]
