"""SparseGPT's engine against an independent float64 port of the paper's algorithm (Frantar & Alistarh 2023, Alg. 1).

The port below is written from the paper, not from the engine or the reference repository: H = 2XXᵀ/N, dead
inputs (H_jj = 0) get H_jj = 1 and their weights 0, damping λ = percdamp·mean(diag H), U = the upper Cholesky factor
of H⁻¹ (computed here as the transposed lower factor of an explicit inverse, another route than the engine's), and
columns in blocks of ``blocksize``. The mask is chosen by w²/[U_jj]² from the weights as updated so far: once per
block over all its rows and columns for unstructured sparsity (the reference implementation's ``prunen == 0``
branch), and per row in every group of m columns for N:M. Each pruned weight's error is propagated to the rest
of its block (OBS update), the block's errors to the later columns at once (lazy batch update).

One convention is the project's, not the reference code's: unstructured prunes exactly ``int(numel·p)`` weights of
each block (the reference prunes every weight ``<=`` the threshold, one more or more on ties; docs/pruning.md).
"""

from __future__ import annotations

import pytest
import torch

from spp.pruning.config import SparsityConfig
from spp.pruning.pruners.sparsegpt import sparsegpt_prune

F64 = torch.float64
U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)
NM24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
NM48 = SparsityConfig(name="nm4_8", kind="nm", n=4, m=8)


def _upper_factor(hessian: torch.Tensor, percdamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Dead inputs fixed, damped, inverted; U with Uᵀ U = H⁻¹ (upper triangular). Also the dead-input flags."""
    H = hessian.to(F64).clone()
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    H = H + percdamp * torch.diagonal(H).mean() * torch.eye(H.shape[0], dtype=F64)
    lower = torch.linalg.cholesky(torch.linalg.inv(H))  # L Lᵀ = H⁻¹, so U = Lᵀ
    return lower.T.contiguous(), dead


def _select_kept(scores: torch.Tensor, sparsity: SparsityConfig) -> torch.Tensor:
    """Keep-mask of a span: drop the int(numel·p) smallest scores of the whole span, or per row the m-n smallest."""
    keep = torch.ones_like(scores, dtype=torch.bool)
    if sparsity.kind == "unstructured":
        k = int(scores.numel() * sparsity.target_ratio)
        drop = torch.topk(scores.flatten(), k, largest=False).indices
        keep.view(-1)[drop] = False
    else:
        drop = torch.topk(scores, int(sparsity.m) - int(sparsity.n), dim=1, largest=False).indices
        keep.scatter_(1, drop, False)
    return keep


def reference_sparsegpt(weight: torch.Tensor, hessian: torch.Tensor, sparsity: SparsityConfig, blocksize: int,
                        percdamp: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1 of the SparseGPT paper in float64; returns (pruned weight, keep-mask)."""
    W = weight.to(F64).clone()
    rows, cols = W.shape
    U, dead = _upper_factor(hessian, percdamp)
    W[:, dead] = 0.0
    keep = torch.ones(rows, cols, dtype=torch.bool)
    select = blocksize if sparsity.kind == "unstructured" else int(sparsity.m)  # the paper's B_s
    for i in range(0, cols, blocksize):
        end = min(i + blocksize, cols)
        E = torch.zeros(rows, end - i, dtype=F64)
        for j in range(i, end):
            if (j - i) % select == 0:
                span = slice(j, min(j + select, end))
                keep[:, span] = _select_kept(W[:, span] ** 2 / torch.diagonal(U)[span] ** 2, sparsity)
            E[:, j - i] = W[:, j] / U[j, j] * (~keep[:, j])  # only pruned weights carry an error
            W[:, j:end] -= torch.outer(E[:, j - i], U[j, j:end])  # OBS update inside the block
        W[:, end:] -= E @ U[i:end, end:]  # lazy batch update of the later columns
    return W * keep, keep


def _problem(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random weight and a correlated Hessian 2XᵀX/N with one dead input."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=gen, dtype=F64)
    mix = torch.eye(cols, dtype=F64) + 0.3 * torch.randn(cols, cols, generator=gen, dtype=F64)
    x = torch.randn(4 * cols, cols, generator=gen, dtype=F64) @ mix * (0.5 + torch.rand(cols, generator=gen))
    x[:, cols // 3] = 0.0  # an input that is never active
    return weight, 2 * x.T @ x / x.shape[0]


@pytest.mark.parametrize("sparsity", [U50, NM24, NM48], ids=lambda s: s.name)
@pytest.mark.parametrize("blocksize", [128, 16])
@pytest.mark.parametrize(("rows", "cols", "seed"), [(16, 64, 0), (24, 96, 1), (8, 200, 2)])
def test_engine_equals_the_float64_port_of_the_paper(sparsity, blocksize, rows, cols, seed) -> None:
    weight, hessian = _problem(rows, cols, seed)
    expected_weight, expected_keep = reference_sparsegpt(weight, hessian, sparsity, blocksize)
    out = sparsegpt_prune(weight, hessian, sparsity, blocksize=blocksize, percdamp=0.01)
    assert out.weight.dtype == F64
    assert torch.equal(out.mask, expected_keep), f"{int((out.mask != expected_keep).sum())} mask entries differ"
    torch.testing.assert_close(out.weight, expected_weight, rtol=1e-9, atol=1e-11)
    # not a vacuous comparison: the pattern is exact, the dead input is pruned and kept weights were updated
    assert int((~expected_keep).sum()) == rows * cols // 2 and not bool(expected_keep[:, cols // 3].any())
    kept = expected_keep & (weight != 0)
    assert float((expected_weight - weight)[kept].abs().max()) > 1e-3


@pytest.mark.parametrize("sparsity", [U50, NM24], ids=lambda s: s.name)
def test_fp32_engine_agrees_with_the_port_up_to_rounding(sparsity) -> None:
    """The production path (fp32) runs the same algorithm: the masks agree except near ties, the weights closely."""
    weight, hessian = _problem(32, 128, 3)
    expected_weight, expected_keep = reference_sparsegpt(weight, hessian, sparsity, blocksize=32)
    out = sparsegpt_prune(weight.float(), hessian.float(), sparsity, blocksize=32)
    assert out.weight.dtype == torch.float32
    assert float((out.mask == expected_keep).float().mean()) > 0.99
    same = out.mask == expected_keep
    torch.testing.assert_close(out.weight.double()[same], expected_weight[same], rtol=1e-3, atol=1e-3)
