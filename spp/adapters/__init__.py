"""Adapters on a pruned model, laid out as peft's tuners: the config, one package per method's layers and equations
(``spp/``, ``lora_star.py``), and one registry (``methods/<name>.py`` modules, see ``registry``)."""

from spp.adapters.base import AdapterMethod, ParamCounts, count_parameters
from spp.adapters.config import AdapterConfig, method_names
from spp.adapters.registry import apply_adapter, get_method, merge_adapter
from spp.projections import DEFAULT_TARGETS

__all__ = [
    "DEFAULT_TARGETS",
    "AdapterConfig",
    "AdapterMethod",
    "ParamCounts",
    "apply_adapter",
    "count_parameters",
    "get_method",
    "merge_adapter",
    "method_names",
]
