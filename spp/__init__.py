"""spp: sparsity-preserved parameter-efficient fine-tuning of pruned LLMs (SPP, ICML 2024)."""

from spp.adapters.base import count_parameters
from spp.adapters.methods.spp import (
    DEFAULT_IMPL,
    IMPLS,
    SPPLinear,
    adapter_state_dict,
    inject,
    load_adapter,
    merge_and_unload,
    read_adapter_config,
    save_adapter,
    set_impl,
    spp_layers,
)
from spp.projections import DEFAULT_TARGETS
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
