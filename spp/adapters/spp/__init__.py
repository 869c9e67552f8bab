"""SPP itself (paper Sec. 3.2): the equations (``functional``), the layer, model-level inject / merge, adapter files."""

from spp.adapters.spp.functional import (
    SPPFusedFunction,
    adapted_weight,
    blocked_adapter,
    merge_factor,
    naive_adapter,
    repeat_alpha,
)
from spp.adapters.spp.io import load_adapter, read_adapter_config, save_adapter
from spp.adapters.spp.layer import DEFAULT_IMPL, IMPLS, SPPLinear
from spp.adapters.spp.model import adapter_state_dict, inject, merge_and_unload, set_impl, spp_layers

__all__ = [
    "DEFAULT_IMPL",
    "IMPLS",
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
