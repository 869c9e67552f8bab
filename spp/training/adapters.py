"""Attach the configured adapter (SPP, LoRA* or none) to a pruned model, and merge it back for export."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from spp.training.config import AdapterConfig


def _field(cfg: Any, key: str) -> Any:
    return cfg[key] if isinstance(cfg, dict) else getattr(cfg, key)


def spp_layer_kwargs(cfg: AdapterConfig | Any) -> dict[str, Any]:
    """The ``spp.SPPLinear`` keyword arguments held by an ``adapter`` config."""
    keys = ("r", "scale", "dropout", "alpha_init", "beta_init", "use_beta", "impl", "residual")
    return {k: _field(cfg, k) for k in keys}


def apply_adapter(model: nn.Module, cfg: AdapterConfig | Any) -> tuple[nn.Module, list[str]]:
    """Attach the adapter named by ``cfg.name`` and freeze every other parameter.

    Trainable parameters are exactly the parameters the injection created (the frozen pruned weights keep
    their tensor identity when they move to ``<name>.base.weight``).

    Args:
        model: The pruned causal LM.
        cfg: The ``adapter`` group (``name`` one of spp, lora, none).

    Returns:
        ``(model, trainable_names)``; the model object may differ when the injection wraps it.

    Raises:
        ValueError: an unknown adapter name, or an injection that created no parameter (targets matched
            nothing: names the ``adapter.targets`` key).
    """
    name = _field(cfg, "name")
    targets = tuple(_field(cfg, "targets"))
    before = {id(p) for p in model.parameters()}
    if name == "none":
        result = model
    elif name == "spp":
        import spp

        result = spp.inject(model, targets=targets, **spp_layer_kwargs(cfg))
    elif name == "lora":
        from spp.baselines.lora import inject_lora

        result = inject_lora(
            model, targets, r=_field(cfg, "r"), alpha=_field(cfg, "lora_alpha"), dropout=_field(cfg, "dropout")
        )
    else:
        raise ValueError(f"adapter.name={name!r}: use one of spp, lora, none")
    if isinstance(result, nn.Module):
        model = result
    trainable: list[str] = []
    for pname, param in model.named_parameters():
        is_new = id(param) not in before
        param.requires_grad_(is_new)
        if is_new:
            trainable.append(pname)
    if name != "none" and not trainable:
        raise ValueError(f"adapter.targets={list(targets)} matched no linear layer of the model; fix adapter.targets")
    return model, trainable


def merge_adapter(
    model: nn.Module, cfg: AdapterConfig | Any, masks: dict[str, torch.Tensor]
) -> tuple[nn.Module, dict[str, Any]]:
    """Fold the adapter into the weights and return a plain HF model.

    SPP: ``W ⊙ (1 + s·Repeat0(alpha)⊙beta)`` (Sec. 3.2), zeros unchanged by construction. LoRA*: ``W + BA``
    then re-masked with the pruning masks (the paper's LoRA* baseline). ``none``: the model as it is.

    Returns:
        ``(merged_model, stats)``; ``stats`` is what the merge reports (LoRA*: re-masked entries).
    """
    name = _field(cfg, "name")
    if name == "spp":
        import spp

        merged = spp.merge_and_unload(model)
        return (merged if isinstance(merged, nn.Module) else model), {}
    if name == "lora":
        from spp.baselines.lora import merge_and_remask

        merged, stats = merge_and_remask(model, masks)
        return merged, stats.to_dict() if hasattr(stats, "to_dict") else dict(stats or {})
    return model, {}


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Trainable and frozen parameter counts (each shared tensor counted once)."""
    seen: set[int] = set()
    trainable = frozen = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
    return {"trainable": trainable, "frozen": frozen, "total": trainable + frozen}
