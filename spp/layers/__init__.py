"""The SPP layer (paper Sec. 3.2) and its exact forward implementations."""

from spp.layers.functional import (
    SPPFusedFunction,
    adapted_weight,
    blocked_adapter,
    merge_factor,
    naive_adapter,
    repeat_alpha,
)
from spp.layers.spp_linear import DEFAULT_IMPL, IMPLS, SPPLinear

__all__ = [
    "DEFAULT_IMPL",
    "IMPLS",
    "SPPFusedFunction",
    "SPPLinear",
    "adapted_weight",
    "blocked_adapter",
    "merge_factor",
    "naive_adapter",
    "repeat_alpha",
]
