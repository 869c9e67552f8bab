"""merge()/unmerge(): the merged weight is W ⊙ (1 + s A beta), zeros keep their exact bits, unmerge restores."""

from __future__ import annotations

import pytest
import torch
from spp_helpers import nm_mask
from torch import nn

from spp import SPPLinear

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MASKS = ["unstructured", (2, 4), (4, 8)]
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def trained_layer(mask, dtype, seed: int = 0, **kwargs) -> SPPLinear:
    """A pruned (64 x 96) layer with non-trivial alpha and beta, as after training."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 96, generator=gen) * 0.05
    if mask == "unstructured":
        w = w * (torch.rand(64, 96, generator=gen) > 0.6)
    else:
        w = w * nm_mask((64, 96), mask[0], mask[1], gen).float()
    lin = nn.Linear(96, 64, bias=False, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.weight[0, 0] = -0.0  # a signed zero must keep its bits too
    layer = SPPLinear(lin, r=16, dropout=0.05, **kwargs)
    with torch.no_grad():
        layer.spp_alpha.copy_(torch.randn(16, 96, generator=gen))
        if layer.spp_beta is not None:
            layer.spp_beta.copy_(torch.randn(64, 1, generator=gen) * 0.3)
    return layer


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", MASKS)
def test_merge_keeps_zero_pattern_bit_identical(mask, dtype):
    layer = trained_layer(mask, dtype)
    before = layer.weight.detach().clone()
    layer.merge()
    after = layer.weight.detach()
    zeros = before == 0
    assert int(zeros.sum()) > 0
    assert torch.equal(after == 0, zeros)  # 0 changed entries in the pattern
    bits_b, bits_a = before.view(INT_VIEW[dtype]), after.view(INT_VIEW[dtype])
    assert torch.equal(bits_a[zeros], bits_b[zeros])  # the zeros are the very same bits (incl. -0.0)
    if isinstance(mask, tuple):  # N:M validity of every group survives
        kept = (after != 0).reshape(64, -1, mask[1]).sum(-1)
        assert int(kept.max()) <= mask[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_merged_values_follow_formula(dtype):
    layer = trained_layer("unstructured", dtype)
    w = layer.weight.detach().double()
    a, b = layer.spp_alpha.detach().double(), layer.spp_beta.detach().double()
    expected = torch.empty_like(w)
    update = torch.empty_like(w)
    for i in range(64):  # W_ij * (1 + s * alpha[i // (m/r), j] * beta_i), row by row
        update[i] = 2.0 * a[i // 4] * b[i]
        expected[i] = w[i] * (1 + update[i])
    layer.merge()
    # forward error of an fp32 factor (one rounding of 1 + s a b) and one rounding of the product in `dtype`
    eps32, eps, tiny = torch.finfo(torch.float32).eps, torch.finfo(dtype).eps, torch.finfo(dtype).tiny
    bound = 2 * eps32 * w.abs() * (1 + update.abs()) + eps * expected.abs() + tiny * eps
    assert bool(((layer.weight.detach().double() - expected).abs() <= bound).all())
    assert bool(((layer.weight.detach().double() - w).abs() > bound).any())  # the merge changed weights


@pytest.mark.parametrize("dtype", DTYPES)
def test_unmerge_restores(dtype):
    layer = trained_layer((2, 4), dtype)
    before = layer.weight.detach().clone()
    layer.merge()
    assert not torch.equal(layer.weight, before)
    layer.unmerge()
    assert torch.equal(layer.weight.view(INT_VIEW[dtype]), before.view(INT_VIEW[dtype]))  # bit-exact copy
    layer.merge(keep_original=False)
    layer.unmerge()  # by division: within one rounding of the dtype
    eps, tiny = torch.finfo(dtype).eps, torch.finfo(dtype).tiny
    factor = layer._factor()
    # two roundings relative to W, plus the subnormal spacing of the merged value magnified by 1/|factor|
    bound = 2 * eps * before.float().abs() + tiny * eps / factor.abs()
    assert bool(((layer.weight.float() - before.float()).abs() <= bound).all())
    assert torch.equal(layer.weight == 0, before == 0)
    with pytest.raises(RuntimeError, match="not merged"):
        layer.unmerge()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kwargs", [{}, {"use_beta": False, "alpha_init": "zeros"}, {"residual": False}])
def test_merged_forward_equals_eval_forward(dtype, kwargs):
    layer = trained_layer("unstructured", dtype, **kwargs).eval()
    x = torch.randn(2, 5, 96).to(dtype)
    y_adapter = layer(x)
    layer.merge()
    y_merged = layer(x)
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(y_merged.float(), y_adapter.float(), rtol=tol, atol=tol)
    with pytest.raises(RuntimeError, match="already merged"):
        layer.merge()


def test_no_residual_merge_is_product():
    layer = trained_layer("unstructured", torch.float32, residual=False)
    w = layer.weight.detach().clone()
    expected = w * layer.spp_alpha.detach().repeat_interleave(4, 0) * layer.spp_beta.detach()
    layer.merge()
    torch.testing.assert_close(layer.weight.detach(), expected, rtol=1e-6, atol=0)
