"""The zero audit of one weight matrix against its pruning mask: what every audit of the project checks.

The training callback (``spp.training.callbacks.sparsity_audit``) and the streamed export (``spp.export.merged``)
both call :func:`check_layer_zeros` on each layer's effective or merged weight: every weight the mask pruned must
be exactly zero, and the zero pattern must equal the pruned model's (unless kept zeros may change, as LoRA*
re-masking allows).
"""

from __future__ import annotations

import torch


class SparsityViolation(RuntimeError):
    """Raised when a weight that the pruning mask zeroed is non-zero, or the zero pattern moved."""


def check_layer_zeros(name: str, w: torch.Tensor, mask: torch.Tensor, expected: torch.Tensor | None,
                      kept_zeros_may_change: bool, when: str) -> tuple[int, int, int]:
    """``(zeros, numel, kept zeros that changed)`` of one layer's effective weight; raises on a violation."""
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
    moved = int((zero != (expected if expected is not None else ~mask)).sum())
    if moved and not kept_zeros_may_change:
        raise SparsityViolation(
            f"[{when}] {name}: the zero pattern differs from the pruning-time pattern at {moved} position(s) "
            "(stopping the run)"
        )
    return int(zero.sum()), zero.numel(), moved
