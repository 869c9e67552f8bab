"""LoRA* (paper Sec. 4, Table 4): LoRA on the pruned model, merged, then re-masked: ``W* = (W~ + ΔW) ⊙ M``.

The part of ``ΔW = s·B A`` on pruned positions is thrown away; ``RemaskStats`` measures how much that was.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from peft import PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import nn

from spp.adapters.peft_base import lora_config
from spp.bitmask import checked_mask
from spp.projections import DEFAULT_TARGETS as LORA_TARGETS


def inject_lora(
    model: nn.Module,
    targets: Sequence[str] = LORA_TARGETS,
    r: int = 8,
    alpha: float = 16,
    dropout: float = 0.05,
    dtype: torch.dtype = torch.float32,
) -> PeftModel:
    """Wrap ``model`` with peft LoRA adapters on ``targets`` (``B = 0``: output unchanged); only ``A``/``B`` train,
    in ``dtype`` (``adapter.dtype``).

    Paper LoRA* settings: r = 8, lora_alpha = 16 (s = 2), dropout 0.05, the 7 projections.
    """
    return cast_factors(get_peft_model(model, lora_config(model, targets, r, alpha, dropout)), dtype)


def cast_factors(model: PeftModel, dtype: torch.dtype) -> PeftModel:
    """Every LoRA layer's ``A`` and ``B`` in ``dtype`` (peft keeps them fp32 or in the base layer's dtype), in place."""
    for _name, layer in lora_layers(model):
        for factor in (*layer.lora_A.values(), *layer.lora_B.values()):
            factor.to(dtype=dtype)
    return model


def lora_layers(model: PeftModel) -> Iterator[tuple[str, LoraLayer]]:
    """The ``(original module name, LoRA layer)`` pairs, e.g. ``("model.layers.0.self_attn.q_proj", layer)``."""
    return ((name, module) for name, module in model.base_model.model.named_modules() if isinstance(module, LoraLayer))


@dataclass
class LayerRemaskStats:
    """What re-masking removed from one merged layer (``removed`` = ‖ΔW ⊙ (1 − M)‖²_F, pruned positions)."""

    name: str
    delta_sq_norm: float
    removed_sq_norm: float
    removed_fraction: float
    pruned_entries: int
    pruned_made_nonzero: int


SUMMED = ("delta_sq_norm", "removed_sq_norm", "pruned_entries", "pruned_made_nonzero")
"""The per-layer numbers :class:`RemaskStats` also gives summed over the layers (``stats.pruned_entries``)."""


@dataclass
class RemaskStats:
    """Per-layer and overall effect of LoRA* re-masking (overall fraction = Σ removed / Σ ‖ΔW‖²)."""

    layers: list[LayerRemaskStats] = field(default_factory=list)

    def __getattr__(self, key: str) -> Any:
        """A :data:`SUMMED` number summed over all layers (e.g. Σ ‖ΔW ⊙ (1 − M)‖²_F as ``removed_sq_norm``)."""
        if key not in SUMMED:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")
        return sum(getattr(s, key) for s in self.layers)

    @property
    def removed_fraction(self) -> float:
        """Share of the whole LoRA update's squared Frobenius norm removed by re-masking."""
        total = self.delta_sq_norm
        return self.removed_sq_norm / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (for ``summary.json``): overall numbers and the per-layer list."""
        return {"removed_fraction": self.removed_fraction, **{k: getattr(self, k) for k in SUMMED},
                "layers": [asdict(s) for s in self.layers]}


def layer_remask_stats(name: str, layer: LoraLayer, mask: torch.Tensor) -> LayerRemaskStats:
    """What re-masking removes from ``layer``'s active update (``pruned_made_nonzero`` is set after the merge)."""
    delta = torch.zeros_like(layer.get_base_layer().weight, dtype=torch.float32)
    for adapter in layer.active_adapters:
        delta += layer.get_delta_weight(adapter).float()
    delta_sq = float(delta.square().sum())
    removed_sq = float(delta.masked_fill(mask, 0.0).square().sum())
    return LayerRemaskStats(name=name, delta_sq_norm=delta_sq, removed_sq_norm=removed_sq,
                            removed_fraction=removed_sq / delta_sq if delta_sq > 0 else 0.0,
                            pruned_entries=int((~mask).sum()), pruned_made_nonzero=0)


def merge_and_remask(model: PeftModel, masks: Mapping[str, torch.Tensor]) -> tuple[nn.Module, RemaskStats]:
    """Merge LoRA into the base weights, then re-apply the pruning masks: ``W* = (W~ + ΔW) ⊙ M`` (LoRA*).

    ``masks`` (True = kept) must cover exactly the LoRA-adapted modules; returns the plain model and the statistics.
    """
    layers = dict(lora_layers(model))
    missing = sorted(set(layers) - set(masks))
    extra = sorted(set(masks) - set(layers))
    if missing or extra:
        raise ValueError(
            f"masks must cover exactly the LoRA-adapted modules; without a mask: {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}; masks for non-LoRA modules: {extra[:5]}"
            f"{' ...' if len(extra) > 5 else ''}"
        )
    with torch.no_grad():
        checked = {name: checked_mask(name, masks[name], layer.get_base_layer().weight)
                   for name, layer in layers.items()}
        stats = RemaskStats([layer_remask_stats(name, layers[name], mask) for name, mask in checked.items()])
        plain = model.merge_and_unload()
        modules = dict(plain.named_modules())
        for layer_stats in stats.layers:
            weight = modules[layer_stats.name].weight
            mask = checked[layer_stats.name]
            layer_stats.pruned_made_nonzero = int(((weight != 0) & ~mask).sum())
            weight.masked_fill_(~mask, 0.0)
    return plain, stats
