"""``fused_cached``: the fused autograd function that keeps the forward's W_eff / W' for the backward.

The float64 formula tests of every impl (``test_spp_linear.py``, parametrized over ``IMPLS``) cover it too; here:
it gives bit-identical results to ``fused`` (same operations, only not repeated), it keeps exactly one extra
out x in tensor per layer (the memory it trades), that tensor is Eq. 5's W' (or the merged weight without
dropout), and the alpha/beta reductions still walk the rows in bounded chunks.
"""

from __future__ import annotations

import pytest
import torch
from spp_helpers import nm_mask
from torch import nn

from spp import IMPLS, SPPLinear
from spp.adapters.methods.spp.functional import adapted_weight, merge_factor

TOL = 1e-10


def _pruned(out_f: int, in_f: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(in_f, out_f, bias=True, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out_f, in_f, generator=gen, dtype=dtype) * nm_mask((out_f, in_f), 2, 4, gen))
        lin.bias.copy_(torch.randn(out_f, generator=gen, dtype=dtype))
    return lin


def _run(impl: str, lin: nn.Linear, p: float, residual: bool = True):
    torch.manual_seed(0)
    layer = SPPLinear(lin, r=8, scale=1.3, dropout=p, beta_init="kaiming", impl=impl, residual=residual).train()
    if not residual:
        with torch.no_grad():
            layer.spp_alpha.normal_(generator=torch.Generator().manual_seed(5))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, lin.in_features, generator=gen, dtype=lin.weight.dtype, requires_grad=True)
    gy = torch.randn(3, 5, lin.out_features, generator=gen, dtype=lin.weight.dtype)
    torch.manual_seed(2)
    y = layer(x)
    y.backward(gy)
    return y.detach(), x.grad, layer.spp_alpha.grad, layer.spp_beta.grad


def test_registered_as_an_impl():
    assert "fused_cached" in IMPLS


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.0, 0.25])
@pytest.mark.parametrize("residual", [True, False])
def test_bit_identical_to_fused(dtype, p, residual):
    lin = _pruned(64, 32, dtype)
    got = _run("fused_cached", lin, p, residual)
    ref = _run("fused", lin, p, residual)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)


def _saved(layer: SPPLinear, x: torch.Tensor) -> list[torch.Tensor]:
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return saved


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_keeps_exactly_one_out_by_in_tensor_and_it_is_eq5(p):
    lin = _pruned(96, 48)
    x = torch.randn(7, 48, dtype=torch.float64, requires_grad=True)
    layer = SPPLinear(lin, r=12, scale=2.0, dropout=p, beta_init="kaiming", impl="fused_cached").train()
    wptr = lin.weight.data_ptr()
    big = [t for t in _saved(layer, x) if t.numel() >= 96 * 48 and t.data_ptr() != wptr]
    assert len(big) == 1 and big[0].shape == (96, 48)
    alpha, beta = layer.spp_alpha.detach(), layer.spp_beta.detach()
    if p > 0:  # W' = s W ⊙ A ⊙ beta (Eq. 5 times s)
        expected = 2.0 * adapted_weight(lin.weight, alpha, beta)
    else:  # merged weight W ⊙ (1 + s A beta)
        expected = lin.weight * merge_factor(alpha, beta, 96, 2.0)
    assert float((big[0] - expected).abs().max()) <= TOL * float(expected.abs().max())
    assert torch.equal(big[0] == 0, lin.weight == 0)  # zeros of W stay exact zeros in the kept weight


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_reductions_still_chunked(monkeypatch, p):
    import spp.adapters.methods.spp.functional as fn

    lin = _pruned(64, 20)
    ref = _run("fused", lin, p)
    monkeypatch.setattr(fn, "BACKWARD_CHUNK_ELEMENTS", 3 * 8 * 20)  # 3 blocks of 8 rows: 3 chunks
    assert len(fn._row_chunks(64, 20, 8)) == 3
    got = _run("fused_cached", lin, p)
    for a, b in zip(got, ref, strict=True):
        assert float((a - b).abs().max()) <= TOL * float(b.abs().max())
