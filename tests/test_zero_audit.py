"""``check_layer_zeros`` on a hand-made 2:4 matrix: the three ways a zero pattern can move, judged apart."""

from __future__ import annotations

import pytest
import torch

from spp.pruning.zero_audit import LayerZeros, SparsityViolation, check_layer_zeros


def _matrix() -> tuple[torch.Tensor, torch.Tensor]:
    """A 4 x 8 weight pruned 2:4 (every other pair kept) and its mask (True = kept)."""
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0]] * 4, dtype=torch.bool)
    w = torch.arange(1.0, 33.0).view(4, 8) * mask
    return w, mask


@pytest.mark.parametrize("may_change", [False, True])
def test_a_kept_weight_that_became_zero_is_counted(may_change: bool) -> None:
    w, mask = _matrix()
    assert check_layer_zeros("m", w, mask, None, may_change, "t") == LayerZeros(16, 32, 0, 0)
    w[2, 5] = 0.0  # a kept weight rounded to 0.0
    assert check_layer_zeros("m", w, mask, None, may_change, "t") == LayerZeros(17, 32, 0, 1)
    assert check_layer_zeros("m", w, mask, ~mask, may_change, "t").zeroed == 1


def test_a_revived_pruned_weight_always_raises() -> None:
    w, mask = _matrix()
    w[1, 3] = 1e-30
    for may_change in (False, True):
        with pytest.raises(SparsityViolation, match=r"^\[t\] m: 1 weight\(s\) pruned by the mask are non-zero"):
            check_layer_zeros("m", w, mask, None, may_change, "t")


def test_a_filled_kept_zero_raises_unless_the_method_may_fill_it() -> None:
    w, mask = _matrix()
    expected = ~mask
    expected[0, 1] = True  # the pruned model had an exact zero at a kept position ...
    w[0, 1] = 0.25  # ... which is non-zero now (LoRA*'s re-masking does this)
    with pytest.raises(SparsityViolation, match="differs from the pruning-time pattern at 1 position"):
        check_layer_zeros("m", w, mask, expected, False, "t")
    assert check_layer_zeros("m", w, mask, expected, True, "t") == LayerZeros(16, 32, 1, 0)
    w[0, 1] = 0.0  # negative control: unchanged, nothing counted
    assert check_layer_zeros("m", w, mask, expected, False, "t") == LayerZeros(17, 32, 0, 0)
