"""SPPLinear: every impl equals the materialized Eq. 5/6 formula in float64 (forward and all gradients)."""

from __future__ import annotations

import math

import pytest
import torch
from spp_helpers import nm_mask
from torch import nn

from spp import IMPLS, SPPLinear
from spp.adapters.methods.spp.functional import BACKWARD_CHUNK_ELEMENTS

TOL = 1e-10


def pruned_linear(out_f: int, in_f: int, mask: str, bias: bool = False, seed: int = 0) -> nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(in_f, out_f, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out_f, in_f, generator=gen, dtype=torch.float64))
        if mask == "unstructured":
            lin.weight.mul_((torch.rand(out_f, in_f, generator=gen, dtype=torch.float64) > 0.5).double())
        else:
            lin.weight.mul_(nm_mask((out_f, in_f), 2, 4, gen))
        if bias:
            lin.bias.copy_(torch.randn(out_f, generator=gen, dtype=torch.float64))
    return lin


def reference(x, w, bias, alpha, beta, s, xd):
    """Eq. 6 written out independently: y = x W^T + b + s * xd (W ⊙ Repeat0(alpha) ⊙ beta)^T."""
    m = w.shape[0]
    k = m // alpha.shape[0]
    rep = torch.stack([alpha[i // k] for i in range(m)])  # row i uses alpha[i // k]
    w_ad = w * rep * (beta if beta is not None else 1.0)
    y = x @ w.t() + s * (xd @ w_ad.t())
    return y + bias if bias is not None else y


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


CASES = [  # (out, in, r, input shape prefix, mask, bias)
    (48, 24, 4, (7,), "unstructured", False),
    (64, 40, 16, (3, 5), "2:4", True),
    (96, 32, 8, (2, 3, 4), "unstructured", True),
    (30, 16, 5, (9,), "2:4", False),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_impl_matches_formula_float64(impl, case, p):
    out_f, in_f, r, prefix, mask, bias = case
    lin = pruned_linear(out_f, in_f, mask, bias)
    torch.manual_seed(1)
    layer = SPPLinear(lin, r=r, scale=1.7, dropout=p, beta_init="kaiming", impl=impl).train()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(*prefix, in_f, generator=gen, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(*prefix, out_f, generator=gen, dtype=torch.float64)
    torch.manual_seed(3)
    y = layer(x)
    y.backward(gy)

    a = layer.spp_alpha.detach().clone().requires_grad_(True)
    b = layer.spp_beta.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    torch.manual_seed(3)  # same RNG state -> same dropout mask
    xd = torch.nn.functional.dropout(x2, p, True) if p > 0 else x2
    y_ref = reference(x2, lin.weight, lin.bias, a, b, 1.7, xd)
    y_ref.backward(gy)

    assert y.shape == (*prefix, out_f)
    assert rel_err(y.detach(), y_ref.detach()) <= TOL
    assert rel_err(x.grad, x2.grad) <= TOL
    assert rel_err(layer.spp_alpha.grad, a.grad) <= TOL
    assert rel_err(layer.spp_beta.grad, b.grad) <= TOL
    assert lin.weight.grad is None  # the pruned weight stays frozen


@pytest.mark.parametrize("impl", IMPLS)
def test_no_beta_and_no_residual_variants(impl):
    lin = pruned_linear(32, 16, "2:4")
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 16, generator=gen, dtype=torch.float64)
    gy = torch.randn(6, 32, generator=gen, dtype=torch.float64)

    nob = SPPLinear(lin, r=8, scale=2.0, dropout=0.0, alpha_init="zeros", use_beta=False, impl=impl)
    assert nob.spp_beta is None
    torch.testing.assert_close(nob(x), lin(x), rtol=0, atol=0)  # starts as the pruned model
    with torch.no_grad():
        nob.spp_alpha.normal_(generator=gen)
    a = nob.spp_alpha.detach().clone().requires_grad_(True)
    nob(x).backward(gy)
    reference(x, lin.weight, None, a, None, 2.0, x).backward(gy)
    assert rel_err(nob.spp_alpha.grad, a.grad) <= TOL

    nores = SPPLinear(lin, r=8, dropout=0.3, residual=False, impl=impl).train()
    assert torch.equal(nores.spp_alpha, torch.ones(8, 16, dtype=torch.float64))
    torch.testing.assert_close(nores(x), lin(x), rtol=1e-14, atol=0)  # ones: W ⊙ 1 ⊙ 1 = W, no dropout
    with torch.no_grad():
        nores.spp_alpha.normal_(generator=gen)
        nores.spp_beta.normal_(generator=gen)
    a = nores.spp_alpha.detach().clone().requires_grad_(True)
    b = nores.spp_beta.detach().clone().requires_grad_(True)
    y = nores(x)
    y.backward(gy)
    k = 32 // 8
    w_ref = lin.weight * a.repeat_interleave(k, 0) * b
    y_ref = x @ w_ref.t()
    y_ref.backward(gy)
    assert rel_err(y.detach(), y_ref.detach()) <= TOL
    assert rel_err(nores.spp_alpha.grad, a.grad) <= TOL
    assert rel_err(nores.spp_beta.grad, b.grad) <= TOL


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_fused_backward_chunks_rows(monkeypatch, p):
    """A chunk smaller than the weight splits the backward into several row ranges and stays exact."""
    import spp.adapters.methods.spp.functional as fn

    monkeypatch.setattr(fn, "BACKWARD_CHUNK_ELEMENTS", 3 * 8 * 20)  # 3 blocks of 8 rows x 20 inputs
    assert fn._row_chunks(64, 20, 8) == [(0, 24), (24, 48), (48, 64)]
    lin = pruned_linear(64, 20, "unstructured")
    layer = SPPLinear(lin, r=8, dropout=p, beta_init="kaiming", impl="fused").train()
    x = torch.randn(5, 20, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(5, 64, dtype=torch.float64)
    torch.manual_seed(7)
    layer(x).backward(gy)
    a = layer.spp_alpha.detach().clone().requires_grad_(True)
    b = layer.spp_beta.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    torch.manual_seed(7)
    xd = torch.nn.functional.dropout(x2, p, True) if p > 0 else x2
    reference(x2, lin.weight, None, a, b, 2.0, xd).backward(gy)
    assert rel_err(x.grad, x2.grad) <= TOL
    assert rel_err(layer.spp_alpha.grad, a.grad) <= TOL
    assert rel_err(layer.spp_beta.grad, b.grad) <= TOL
    assert BACKWARD_CHUNK_ELEMENTS == 1 << 24


def _saved_sizes(layer: SPPLinear, x: torch.Tensor) -> list[tuple[int, bool]]:
    """(numel, is the base weight itself) of every tensor autograd saves during ``layer(x)``."""
    sizes = []
    wptr = layer.base.weight.data_ptr()

    def pack(t):
        sizes.append((t.numel(), t.data_ptr() == wptr))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sizes


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_fused_keeps_no_out_by_in_temporary(p):
    lin = nn.Linear(64, 128, bias=False)
    x = torch.randn(8, 64, requires_grad=True)
    fused = _saved_sizes(SPPLinear(lin, r=16, dropout=p, impl="fused").train(), x)
    big = [n for n, is_w in fused if n >= 128 * 64 and not is_w]
    assert big == []
    naive = _saved_sizes(SPPLinear(lin, r=16, dropout=p, impl="naive").train(), x)
    assert any(n >= 128 * 64 and not is_w for n, is_w in naive)  # the check can fail: naive keeps W'


def test_init_values_and_starts_as_pruned_model():
    lin = pruned_linear(32, 48, "2:4")
    torch.manual_seed(0)
    layer = SPPLinear(lin, r=4)
    bound = 1.0 / math.sqrt(48)  # kaiming_uniform_(a=sqrt(5)) on fan_in=48
    assert layer.spp_alpha.shape == (4, 48) and layer.spp_beta.shape == (32, 1)
    assert float(layer.spp_alpha.detach().abs().max()) <= bound and float(layer.spp_alpha.detach().std()) > bound / 4
    assert torch.count_nonzero(layer.spp_beta) == 0
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["spp_alpha", "spp_beta"]
    x = torch.randn(3, 48, dtype=torch.float64)
    assert torch.equal(layer.eval()(x), lin(x))
    assert layer.in_features == 48 and layer.out_features == 32 and layer.weight is lin.weight


def test_errors_are_clear():
    lin = nn.Linear(8, 12)
    msg = r"layers.0.q_proj: r=5 does not divide out_features=12.*\[1, 2, 3, 4, 6, 12\]"
    with pytest.raises(ValueError, match=msg):
        SPPLinear(lin, r=5, name="layers.0.q_proj")
    with pytest.raises(ValueError, match="both 'zeros'"):
        SPPLinear(lin, r=4, alpha_init="zeros", beta_init="zeros")
    with pytest.raises(ValueError, match="use_beta=False needs alpha_init='zeros'"):
        SPPLinear(lin, r=4, use_beta=False)
    with pytest.raises(ValueError, match="unknown impl 'fast'"):
        SPPLinear(lin, r=4, impl="fast")
    with pytest.raises(ValueError, match="dropout=1.5"):
        SPPLinear(lin, r=4, dropout=1.5)


@pytest.mark.parametrize("p", [0.0, 0.2])
def test_fused_under_bf16_autocast_matches_naive(p):
    """Mixed precision (Lightning's bf16-mixed uses autocast): same dtypes and values as the naive impl."""
    lin = nn.Linear(64, 96, bias=True)
    results = {}
    for impl in ("naive", "fused"):
        torch.manual_seed(0)
        layer = SPPLinear(lin, r=8, dropout=p, beta_init="kaiming", impl=impl).train()
        x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        torch.manual_seed(2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        y.float().square().sum().backward()
        results[impl] = (y, x.grad, layer.spp_alpha.grad, layer.spp_beta.grad)
    for got, ref in zip(results["fused"], results["naive"], strict=True):
        assert got.dtype == ref.dtype
        torch.testing.assert_close(got.float(), ref.float(), rtol=0.05, atol=0.02 * float(ref.detach().abs().max()))
    assert results["fused"][0].dtype == torch.bfloat16 and results["fused"][2].dtype == torch.float32
