"""``adapter=spp``: SPP itself (paper Sec. 3.2): config, equations, layer, inject / merge, files, method."""

from spp.adapters.methods.spp.io import load_adapter, read_adapter_config, save_adapter
from spp.adapters.methods.spp.layer import DEFAULT_IMPL, IMPLS, SPPLinear
from spp.adapters.methods.spp.method import METHOD
from spp.adapters.methods.spp.model import adapter_state_dict, inject, merge_and_unload, set_impl, spp_layers
from spp.adapters.registry import register

register(METHOD)

__all__ = [  # the names ``spp`` exports from here
    "DEFAULT_IMPL",
    "IMPLS",
    "SPPLinear",
    "adapter_state_dict",
    "inject",
    "load_adapter",
    "merge_and_unload",
    "read_adapter_config",
    "save_adapter",
    "set_impl",
    "spp_layers",
]
