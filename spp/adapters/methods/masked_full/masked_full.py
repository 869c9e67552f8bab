"""Masked full fine-tuning: every weight of the adapted projections trains, its gradient multiplied by the mask.

The upper bound of sparse fine-tuning (llm-compressor's ``ConstantPruningModifier``): with AdamW a pruned weight never
moves (zero gradient, moments and update; decoupled decay multiplies 0). Costs gradients + two moments per weight.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from spp.adapters.base import check_masks_cover, freeze_all, target_linears, write_record
from spp.bitmask import checked_mask, pack_rows, unpack_rows
from spp.projections import DEFAULT_TARGETS

MASK_BUFFER = "masked_full_mask"
"""Name of the bit-packed mask buffer put on every adapted ``nn.Linear``."""

MASK_BUFFERS = (MASK_BUFFER, "mask_packed")
"""Suffixes of the packed-mask buffers counted by :func:`estimate_training_memory` (masked full's, and those of
:class:`~spp.adapters.peft_base.MaskedLoraLinear`)."""

HOOK_ATTR = "_masked_full_hook"
HOOKED_ATTR = "_masked_full_hooked"
"""A weak reference to the weight object that holds the hook (placement may replace it)."""
META_NAME = "masked_full.json"
ADAMW_STATES = 2
"""AdamW keeps two moments (``exp_avg``, ``exp_avg_sq``) per trainable weight, in the weight's dtype."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Training memory of the trainable parameters (activations excluded); ``available_bytes`` is free memory now."""

    trainable_params: int
    kept_params: int
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    mask_bytes: int
    device: str
    available_bytes: int

    @property
    def required_bytes(self) -> int:
        """What training adds to the resident weights: gradients, AdamW states and masks."""
        return self.grad_bytes + self.optimizer_bytes + self.mask_bytes

    @property
    def total_bytes(self) -> int:
        """Weights + gradients + AdamW states + masks."""
        return self.weight_bytes + self.required_bytes

    @property
    def fits(self) -> bool:
        """Whether ``required_bytes`` fits into ``available_bytes``."""
        return self.required_bytes <= self.available_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (for logs and ``summary.json``), with GiB totals."""
        return {**asdict(self), "required_bytes": self.required_bytes, "total_bytes": self.total_bytes,
                "total_gib": self.total_bytes / 2**30, "required_gib": self.required_bytes / 2**30,
                "available_gib": self.available_bytes / 2**30}


def available_memory(device: torch.device) -> int:
    """Free bytes on ``device``: CUDA free device memory, else psutil's available RAM."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def _unique(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return list({id(p): p for p in params}.values())


def estimate_training_memory(model: nn.Module, trainable: Iterable[torch.Tensor] | None = None,
                             kept_params: int | None = None, mask_bytes: int | None = None,
                             available_bytes: int | None = None) -> MemoryEstimate:
    """Weights + gradients + AdamW states of the trainable parameters of ``model`` (any adapter method).

    ``trainable`` defaults to ``requires_grad`` parameters, ``kept_params`` to all their entries, ``mask_bytes`` to the
    packed mask buffers (:data:`MASK_BUFFERS`); ``available_bytes`` overrides the measured free memory (tests).
    """
    params = _unique(model.parameters())
    train = _unique(trainable) if trainable is not None else [p for p in params if p.requires_grad]
    n_train = sum(p.numel() for p in train)
    train_bytes = sum(p.numel() * p.element_size() for p in train)
    if mask_bytes is None:
        mask_bytes = sum(b.numel() * b.element_size() for name, b in model.named_buffers(remove_duplicate=True)
                         if name.endswith(MASK_BUFFERS))
    device = next((p.device for p in train), params[0].device if params else torch.device("cpu"))
    return MemoryEstimate(
        trainable_params=n_train,
        kept_params=n_train if kept_params is None else kept_params,
        weight_bytes=sum(p.numel() * p.element_size() for p in params),
        grad_bytes=train_bytes,
        optimizer_bytes=ADAMW_STATES * train_bytes,
        mask_bytes=mask_bytes,
        device=str(device),
        available_bytes=available_memory(device) if available_bytes is None else available_bytes,
    )


def masked_full_layers(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear layers of ``model`` prepared by :func:`inject_masked_full`, by module name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and hasattr(m, MASK_BUFFER)}


def mask_gradients(model: nn.Module) -> None:
    """Zero the pruned entries of every masked layer's gradient.

    Sharding (``fully_shard``) and ``to_empty`` make new weight objects and lose the tensor hook, so this runs before
    every optimizer step; a ``DTensor`` gradient is masked in this rank's rows (FSDP2 shards dim 0 in ``torch.chunk``
    pieces). Masking is element-wise, so masking after the cross-rank average equals averaging masked gradients.
    """
    from torch.distributed.tensor import DTensor

    for module in masked_full_layers(model).values():
        grad = module.weight.grad
        if grad is None:
            continue
        local, offset = grad, 0
        if isinstance(grad, DTensor):
            local, rows = grad.to_local(), module.weight.shape[0]
            offset = min(grad.device_mesh.get_local_rank() * -(-rows // grad.device_mesh.size()), rows)
        packed = getattr(module, MASK_BUFFER)[offset : offset + local.shape[0]]
        local.masked_fill_(~unpack_rows(packed, module.weight.shape[1]).to(local.device), 0.0)


def _hook(module: nn.Linear) -> None:
    """Register the gradient-mask hook on ``module.weight`` and remember which weight object holds it."""
    def mask(grad: torch.Tensor) -> torch.Tensor:
        return grad.masked_fill(~unpack_rows(getattr(module, MASK_BUFFER), grad.shape[-1]).to(grad.device), 0.0)

    setattr(module, HOOK_ATTR, module.weight.register_hook(mask))
    setattr(module, HOOKED_ATTR, weakref.ref(module.weight))


def restore_gradient_hooks(model: nn.Module) -> None:
    """Put the gradient-mask hook back on each masked layer's *current* weight object.

    Needed for DeepSpeed, which moves each gradient into its own buffers as soon as it is computed (``weight.grad`` is
    empty at step time). Not for FSDP2 (:func:`mask_gradients` masks its shard).
    """
    for module in masked_full_layers(model).values():
        handle = getattr(module, HOOK_ATTR, None)
        hooked = getattr(module, HOOKED_ATTR, None)
        if hooked is not None and hooked() is module.weight:
            continue
        if handle is not None:
            handle.remove()
        _hook(module)


def inject_masked_full(
    model: nn.Module,
    masks: Mapping[str, torch.Tensor] | None = None,
    targets: Sequence[str] = DEFAULT_TARGETS,
    available_bytes: int | None = None,
) -> nn.Module:
    """Make every weight of the ``targets`` linears trainable with gradient ``dL/dW ⊙ M``; freeze the rest.

    ``masks`` (True = kept, by module name; ``None``/empty = the weights' non-zeros) give ``M = mask ∧ (W ≠ 0)``.
    Raises ValueError on bad targets/masks or a prepared model, MemoryError when gradients + AdamW states do not fit
    (not checked on ``meta``, where Table 1 builds models: nothing is allocated).
    """
    if masked_full_layers(model):
        raise ValueError("inject_masked_full: the model is already prepared for masked full fine-tuning")
    found = target_linears(model, tuple(targets))
    check_masks_cover("masked_full", found, masks)
    keep = {}
    for name, module in found.items():
        weight = module.weight.detach()
        mask = checked_mask(name, masks[name], weight) if masks else torch.ones_like(weight, dtype=torch.bool)
        keep[name] = pack_rows(mask & (weight != 0))
    if not any(p.is_meta for p in keep.values()):
        kept = sum(int(unpack_rows(p, found[n].in_features).sum()) for n, p in keep.items())
        estimate = estimate_training_memory(model, [m.weight for m in found.values()], kept_params=kept,
                                            mask_bytes=sum(p.numel() for p in keep.values()),
                                            available_bytes=available_bytes)
        if not estimate.fits:
            raise MemoryError(
                f"adapter.name=masked_full needs {estimate.required_bytes / 2**30:.2f} GiB for the gradients and AdamW "
                f"states of {estimate.trainable_params:,} weights ({estimate.total_bytes / 2**30:.2f} GiB with the "
                f"model's weights, activations not counted) but {estimate.device} has "
                f"{estimate.available_bytes / 2**30:.2f} GiB free; use a larger device or a parameter-efficient "
                "method (adapter.name=spp, sparse_lora or lora)")
    freeze_all(model)
    for name, module in found.items():
        module.register_buffer(MASK_BUFFER, keep[name], persistent=False)
        module.weight.requires_grad_(True)
        _hook(module)
    return model


def kept_parameters(model: nn.Module) -> int:
    """Weights that masked full fine-tuning trains (the kept entries of the adapted layers)."""
    return sum(layer_stats(m)["kept_params"] for m in masked_full_layers(model).values())


def layer_stats(module: nn.Linear) -> dict[str, int]:
    """A prepared layer's kept weights, its trainable entries and its pruned entries that are not zero (should be 0)."""
    keep = unpack_rows(getattr(module, MASK_BUFFER), module.in_features).to(module.weight.device)
    return {"kept_params": int(keep.sum()), "trainable_params": keep.numel(),
            "pruned_nonzero": int(((module.weight != 0) & ~keep).sum())}


@torch.no_grad()
def merge_masked_full(model: nn.Module) -> tuple[nn.Module, dict[str, Any]]:
    """The identity on the weights: remove hooks and masks, freeze; report stats (``pruned_nonzero`` should be 0)."""
    layers = masked_full_layers(model)
    if not layers:
        raise ValueError("merge_masked_full: the model holds no layer prepared by inject_masked_full")
    stats = [layer_stats(module) for module in layers.values()]
    for module in layers.values():
        getattr(module, HOOK_ATTR).remove()
        delattr(module, HOOK_ATTR)
        delattr(module, HOOKED_ATTR)
        delattr(module, MASK_BUFFER)
    freeze_all(model)
    return model, {"layers": len(layers), **{k: sum(s[k] for s in stats) for k in stats[0]}}


def save_masked_full(model: nn.Module, directory: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
    """Write ``masked_full.json`` (layers, kept counts, memory); the trained weights are the merged model itself."""
    layers = masked_full_layers(model)
    if not layers:
        raise ValueError("save_masked_full: the model holds no layer prepared by inject_masked_full")
    write_record(Path(directory) / META_NAME, "masked_full", extra, memory=estimate_training_memory(model).to_dict(),
                 layers={n: int(unpack_rows(getattr(m, MASK_BUFFER), m.in_features).sum()) for n, m in layers.items()})
    return Path(directory)
