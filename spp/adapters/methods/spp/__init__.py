"""``adapter=spp``: SPP itself (paper Sec. 3.2): config, equations, layer, inject / merge, files, method."""

from spp.adapters.methods.spp.config import Impl, Init, SPPAdapterConfig
from spp.adapters.methods.spp.functional import (
    SPPFusedFunction,
    adapted_weight,
    blocked_adapter,
    merge_factor,
    naive_adapter,
    repeat_alpha,
)
from spp.adapters.methods.spp.io import load_adapter, read_adapter_config, save_adapter
from spp.adapters.methods.spp.layer import DEFAULT_IMPL, IMPLS, SPPLinear
from spp.adapters.methods.spp.method import METHOD
from spp.adapters.methods.spp.model import adapter_state_dict, inject, merge_and_unload, set_impl, spp_layers
from spp.adapters.registry import register

register(METHOD)

__all__ = [
    "DEFAULT_IMPL",
    "IMPLS",
    "METHOD",
    "Impl",
    "Init",
    "SPPAdapterConfig",
    "SPPFusedFunction",
    "SPPLinear",
    "adapted_weight",
    "adapter_state_dict",
    "blocked_adapter",
    "inject",
    "load_adapter",
    "merge_and_unload",
    "merge_factor",
    "naive_adapter",
    "read_adapter_config",
    "repeat_alpha",
    "save_adapter",
    "set_impl",
    "spp_layers",
]
