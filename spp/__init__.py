"""spp: sparsity-preserved parameter-efficient fine-tuning of pruned LLMs (SPP, ICML 2024)."""

from spp.adapter_io import load_adapter, read_adapter_config, save_adapter
from spp.injection import (
    DEFAULT_TARGETS,
    adapter_state_dict,
    count_parameters,
    inject,
    merge_and_unload,
    set_impl,
    spp_layers,
)
from spp.layers import DEFAULT_IMPL, IMPLS, SPPLinear
from spp.version import __version__

__all__ = [
    "DEFAULT_IMPL",
    "DEFAULT_TARGETS",
    "IMPLS",
    "SPPLinear",
    "__version__",
    "adapter_state_dict",
    "count_parameters",
    "inject",
    "load_adapter",
    "merge_and_unload",
    "read_adapter_config",
    "save_adapter",
    "set_impl",
    "spp_layers",
]
