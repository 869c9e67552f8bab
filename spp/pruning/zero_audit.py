"""The zero audit of one weight matrix against its pruning mask: what every audit of the project checks.

The training callback (``spp.training.callbacks.sparsity_audit``) and the streamed export (``spp.export.merged``)
both call :func:`check_layer_zeros` on each layer's effective or merged weight. The two directions a zero pattern
can move in are judged apart:

- a weight the mask pruned that is non-zero (*revived*) always raises: sparsity was lost;
- a kept weight that was exactly zero at pruning time and is not any more (*filled*) raises unless the method
  declares it (LoRA*'s re-masking fills such weights);
- a kept weight that *became* exactly zero (*zeroed*: an additive update ``W + ΔW`` or a product ``W ⊙ S`` that
  rounds to 0.0 in float arithmetic) is counted and reported, never raised: the model has more zeros, never fewer.
"""

from __future__ import annotations

from typing import NamedTuple

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
    """The audit of one layer's effective weight ``w`` against ``mask`` (True = kept) and the pruning-time zero
    pattern ``expected`` (``None`` = ``~mask``); raises :class:`SparsityViolation` on a revived weight, or on a
    filled kept zero unless ``kept_zeros_may_change``."""
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
