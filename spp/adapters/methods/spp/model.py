"""Put SPP layers into a Hugging Face causal LM and take them out again (merged)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from spp.adapters.base import set_submodule, wrap_targets
from spp.adapters.methods.spp.layer import IMPLS, SPPLinear
from spp.projections import DEFAULT_TARGETS


def spp_layers(model: nn.Module) -> dict[str, SPPLinear]:
    """All ``SPPLinear`` modules of ``model`` by module path (in ``named_modules`` order)."""
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, SPPLinear)}


def inject(model: nn.Module, targets: Iterable[str] = DEFAULT_TARGETS, **layer_kwargs: Any) -> nn.Module:
    """Replace every targeted ``nn.Linear`` by an ``SPPLinear`` (``layer_kwargs``), freeze the rest; in place.

    ``targets`` are module-name suffixes; the default stands for every decoder-block projection of any architecture.
    """
    return wrap_targets(model, targets, SPPLinear, "inject", "merge_and_unload", **layer_kwargs)


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Merge every SPP layer into its base weight (its dtype, zeros kept); put the plain ``nn.Linear`` back."""
    layers = spp_layers(model)
    if not layers:
        raise ValueError("merge_and_unload: the model holds no SPPLinear layers (nothing to merge).")
    for name, layer in layers.items():
        if not layer.merged:
            layer.merge(keep_original=False)
        layer._original_weight = None
        set_submodule(model, name, layer.base)
    return model


def adapter_state_dict(model: nn.Module) -> dict[str, Any]:
    """Only the SPP parameters: ``<layer path>.spp_alpha`` and ``<layer path>.spp_beta`` (detached tensors)."""
    return {f"{name}.{key}": p.detach() for name, layer in spp_layers(model).items()
            for key, p in (("spp_alpha", layer.spp_alpha), ("spp_beta", layer.spp_beta)) if p is not None}


def set_impl(model: nn.Module, impl: str) -> None:
    """Switch every SPP layer of ``model`` to another exact implementation (``fused``/``naive``/``blocked``)."""
    if impl not in IMPLS:
        raise ValueError(f"set_impl: unknown impl {impl!r}; choose one of {list(IMPLS)}.")
    for layer in spp_layers(model).values():
        layer.impl = impl
