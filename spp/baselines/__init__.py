"""Baselines the paper compares SPP against (LoRA followed by re-masking: the paper's LoRA*)."""

from spp.baselines.lora import (
    LORA_TARGETS,
    LayerRemaskStats,
    RemaskStats,
    inject_lora,
    lora_layers,
    masks_from_weights,
    merge_and_remask,
)

__all__ = [
    "LORA_TARGETS",
    "LayerRemaskStats",
    "RemaskStats",
    "inject_lora",
    "lora_layers",
    "masks_from_weights",
    "merge_and_remask",
]
