"""Finding the decoder blocks and the linear layers to prune, and reading a model's current zero pattern."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from spp.projections import DEFAULT_TARGETS, block_projections, decoder_layers, matches, names_in

__all__ = ["block_linears", "current_masks", "decoder_layers"]


def block_linears(block: nn.Module, targets: Iterable[str]) -> dict[str, nn.Linear]:
    """Linear projections of one block named by ``targets`` (already resolved: leaf names or in-block paths),
    keyed by their name inside the block."""
    targets = list(targets)
    return {name: module for name, module in block_projections(block).items() if matches(name, targets)}


def current_masks(model: nn.Module, targets: Iterable[str] = DEFAULT_TARGETS) -> dict[str, torch.Tensor]:
    """Nonzero pattern (True = nonzero) of every target linear by qualified name; after SPP injection a pruned
    ``<name>.base.weight`` is reported as ``<name>``."""
    targets = names_in(model, targets, "pruner.targets")
    masks: dict[str, torch.Tensor] = {}
    from_base: set[str] = set()
    for module_name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        is_base = module_name.endswith(".base")
        name = module_name[: -len(".base")] if is_base else module_name
        if not matches(name, targets) or (name in from_base and not is_base):
            continue
        masks[name] = weight.detach() != 0
        if is_base:
            from_base.add(name)
    return masks
