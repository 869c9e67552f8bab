"""Finding the decoder blocks and the linear layers to prune, and reading a model's current zero pattern."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from spp.pruning.config import DEFAULT_TARGETS


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """Return (qualified name, ModuleList) of the model's decoder blocks (``model.layers`` for LLaMA).

    Raises:
        ValueError: no ModuleList with ``config.num_hidden_layers`` entries exists.
    """
    config = getattr(model, "config", None)
    expected = getattr(config, "num_hidden_layers", None)
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and (expected is None or len(module) == expected):
            return name, module
    raise ValueError(
        f"could not find the decoder blocks of {type(model).__name__} (a ModuleList of num_hidden_layers="
        f"{expected} modules); only decoder-style causal LMs such as LLaMA are supported"
    )


def block_linears(block: nn.Module, targets: Iterable[str]) -> dict[str, nn.Linear]:
    """Linear layers of one block whose leaf name is in ``targets``, keyed by their name inside the block."""
    wanted = set(targets)
    return {
        name: module
        for name, module in block.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in wanted
    }


def target_linears(model: nn.Module, targets: Iterable[str] = DEFAULT_TARGETS) -> dict[str, nn.Linear]:
    """All prunable linears in decoder order, keyed by qualified name (``model.layers.0.self_attn.q_proj``).

    Raises:
        ValueError: ``targets`` matches no linear layer (lists the names that exist).
    """
    targets = list(targets)
    prefix, layers = decoder_layers(model)
    found: dict[str, nn.Linear] = {}
    for i, block in enumerate(layers):
        for name, module in block_linears(block, targets).items():
            found[f"{prefix}.{i}.{name}"] = module
    if not found:
        available = sorted({n.rsplit(".", 1)[-1] for n, m in layers[0].named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(
            f"pruner.targets={targets} matches no linear layer in the decoder blocks; available: {available}"
        )
    return found


def current_masks(model: nn.Module, targets: Iterable[str] = DEFAULT_TARGETS) -> dict[str, torch.Tensor]:
    """Nonzero pattern (True = nonzero) of every target linear, keyed by the linear's qualified name.

    Works after SPP injection too: a pruned weight living at ``<name>.base.weight`` is reported as ``<name>``
    (and preferred over any ``<name>.weight`` of the wrapper).
    """
    wanted = set(targets)
    masks: dict[str, torch.Tensor] = {}
    from_base: set[str] = set()
    for module_name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        is_base = module_name.endswith(".base")
        name = module_name[: -len(".base")] if is_base else module_name
        if name.rsplit(".", 1)[-1] not in wanted or (name in from_base and not is_base):
            continue
        masks[name] = weight.detach() != 0
        if is_base:
            from_base.add(name)
    return masks
