"""The zero audit of one weight matrix against its pruning mask, used by the training callback and the export.
A revived pruned weight always raises; a filled kept zero raises unless the method declares it (LoRA*'s re-masking);
a kept weight rounded to exactly zero is only counted."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class SparsityViolation(RuntimeError):
    """Raised when a weight that the pruning mask zeroed is non-zero, or a kept zero was filled unexpectedly."""


class LayerZeros(NamedTuple):
    """The zero audit of one matrix: its zeros and size, and how its kept positions moved since pruning."""

    zeros: int
    numel: int
    filled: int  # kept positions exactly zero at pruning time that are non-zero now (LoRA* re-masking)
    zeroed: int  # kept weights non-zero at pruning time that are exactly zero now (rounding; more sparsity)


def check_layer_zeros(name: str, w: torch.Tensor, mask: torch.Tensor, expected: torch.Tensor | None,
                      kept_zeros_may_change: bool, when: str) -> LayerZeros:
    """Audit one layer's effective weight ``w`` against ``mask`` (True = kept) and the pruning-time zero pattern
    ``expected`` (``None`` = ``~mask``); raises :class:`SparsityViolation`."""
    zero = (w == 0).cpu()
    mask = mask.to(torch.bool).cpu()
    if zero.shape != mask.shape:
        raise SparsityViolation(f"[{when}] {name}: weight shape {tuple(zero.shape)} != mask {tuple(mask.shape)}")
    revived = int((~mask & ~zero).sum())
    if revived:
        raise SparsityViolation(
            f"[{when}] {name}: {revived} weight(s) pruned by the mask are non-zero; the sparsity pattern "
            "was not preserved (stopping the run)"
        )
    before = expected.to(torch.bool).cpu() if expected is not None else ~mask
    filled, zeroed = int((before & ~zero).sum()), int((~before & zero).sum())
    if filled and not kept_zeros_may_change:
        raise SparsityViolation(
            f"[{when}] {name}: the zero pattern differs from the pruning-time pattern at {filled} position(s): "
            "kept weights that were exactly zero are non-zero now (stopping the run)"
        )
    return LayerZeros(int(zero.sum()), zero.numel(), filled, zeroed)


def audit_summary(layers: int, zeros: int, total: int, filled: int, zeroed: int) -> dict[str, Any]:
    """The audit's record over ``layers`` matrices (the training audit's and ``spp_export.json``'s ``audit``)."""
    return {"layers": layers, "zeros": zeros, "total": total, "sparsity": zeros / max(total, 1),
            "kept_zeros_changed": filled + zeroed, "kept_zeros_filled": filled, "kept_weights_zeroed": zeroed}
