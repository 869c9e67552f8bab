"""What every adapter method provides (the registry's interface), and the helpers they share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from spp.adapters.config import AdapterConfig

Masks = dict[str, torch.Tensor]
"""Pruning masks (True = kept) keyed by the original linear names (``model.layers.0.self_attn.q_proj``)."""

ExternalParameters = list[tuple[nn.Module, nn.Parameter]]
"""``(reader, parameter)`` pairs: ``reader``'s forward (and so its backward) reads ``parameter`` of another module
without calling that module (what DeepSpeed ZeRO-3 must gather for it: ``register_external_parameter``)."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
}


class ParamCounts(NamedTuple):
    """Trainable and frozen parameter counts (each shared tensor counted once)."""

    trainable: int
    frozen: int

    @property
    def total(self) -> int:
        """All parameters."""
        return self.trainable + self.frozen

    def to_dict(self) -> dict[str, int]:
        """``{"trainable", "frozen", "total"}`` (the summary's ``params``)."""
        return {"trainable": self.trainable, "frozen": self.frozen, "total": self.total}


def count_parameters(model: nn.Module) -> ParamCounts:
    """Count trainable and frozen parameters of ``model`` (tied tensors once)."""
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
    return ParamCounts(trainable, frozen)


class AdapterMethod(ABC):
    """One way to fine-tune a pruned model; a module of ``spp/adapters/methods/`` exposes one as ``METHOD``.

    Attributes:
        name: The ``adapter.name`` value.
        trains: Whether the method has a training loop (``none`` has not).
        kept_zeros_may_change: The merge may fill kept weights that happened to be exactly zero (LoRA*
            re-masking); pruned positions must stay zero for every method.
        zero3_refusal: Why the method cannot train under DeepSpeed ZeRO-3 (``strategy=deepspeed_stage3``), or
            ``None`` when it can (the preflight refuses the job in one line otherwise).
    """

    name: ClassVar[str] = ""
    trains: ClassVar[bool] = True
    kept_zeros_may_change: ClassVar[bool] = False
    zero3_refusal: ClassVar[str | None] = None

    @abstractmethod
    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        """Attach the adapter; afterwards exactly the adapter's parameters require grad."""

    @abstractmethod
    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        """Fold the adapter into plain ``nn.Linear`` weights; returns the model and what the merge reports."""

    @abstractmethod
    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        """Write the adapter files into ``directory`` (which exists and is empty)."""

    def external_parameters(self, model: nn.Module) -> ExternalParameters:
        """Every parameter a module of the injected ``model`` reads without calling the module that owns it, with
        that reader (:data:`ExternalParameters`). ZeRO-3 gathers a module's own parameters around its forward and
        backward only, so these must be registered for their reader. Default: none (every read goes through the
        owner's own forward, as peft LoRA's ``lora_A(x)`` does)."""
        return []

    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """``module``'s weights as :meth:`merge` writes them, with what the merge reports of this layer, when
        ``module`` is one of this method's adapted layers; else ``None``.

        The streamed export (``spp.export.merged``) calls it one layer at a time on whole (unsharded) layers, so a
        model is never merged whole; ``module`` itself is left as it is. ``mask`` is the layer's pruning mask
        (True = kept). The default: the method adapts no layer.
        """
        return None

    def merge_summary(self, layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """What :meth:`merge` reports, from every layer's :attr:`MergedLayer.stats` by layer name (default: ``{}``)."""
        return {}


class MergedLayer(NamedTuple):
    """One adapted layer merged: its plain tensors (``weight``, ``bias``) and what the merge reports of it."""

    tensors: dict[str, torch.Tensor]
    stats: dict[str, Any] = {}


def linear_tensors(linear: nn.Module) -> dict[str, torch.Tensor]:
    """``{"weight", "bias"}`` of a plain linear layer (detached; no bias key without a bias)."""
    out = {"weight": linear.weight.detach()}
    if getattr(linear, "bias", None) is not None:
        out["bias"] = linear.bias.detach()
    return out


def freeze_all(model: nn.Module) -> None:
    """Set ``requires_grad=False`` on every parameter of ``model``."""
    for p in model.parameters():
        p.requires_grad_(False)
