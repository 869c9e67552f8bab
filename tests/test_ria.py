"""RIA (spp/pruning/pruners/ria/): the score (paper Eq. 2-3) in float64, the scopes, channel reallocation, the
config's refusals, and its option composed by Hydra."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from spp.paths import REPO_ROOT
from spp.pruning import SparsityConfig, check_nm
from spp.pruning.pruners.ria import RIA, RIAConfig, reallocation_order, ria_mask, ria_scores

U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)
NM24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)


def _layer(rows: int = 12, cols: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, cols, generator=g), torch.rand(cols, generator=g) * 10


def test_score_is_relative_importance_times_activation_power() -> None:
    w, norm_sq = _layer()
    w64 = w.double().abs()
    expected = (w64 / w64.sum(0, keepdim=True) + w64 / w64.sum(1, keepdim=True)) * norm_sq.double().sqrt() ** 0.5
    torch.testing.assert_close(ria_scores(w, norm_sq, 0.5).double(), expected, rtol=1e-6, atol=0)
    w[:, 3] = 0  # a dead input column: share 0, not NaN
    assert torch.isfinite(ria_scores(w, norm_sq, 0.5)).all()


def test_scopes_prune_exactly_the_ratio() -> None:
    scores = ria_scores(*_layer(), 0.5)
    per_matrix, _ = ria_mask(scores, U50, "matrix")
    per_row, _ = ria_mask(scores, U50, "row")
    assert int((~per_matrix).sum()) == scores.numel() // 2
    assert ((~per_row).sum(1) == scores.shape[1] // 2).all()
    assert not torch.equal(per_matrix, per_row)  # the two scopes are different rules


def test_reallocation_is_nm_in_its_order_and_keeps_more_score() -> None:
    scores = ria_scores(*_layer(64, 64), 0.5)
    plain, none = ria_mask(scores, NM24)
    permuted, order = ria_mask(scores, NM24, permute=True)
    assert none is None and sorted(order.tolist()) == list(range(64))
    assert check_nm(plain, 2, 4) and check_nm(permuted[:, order], 2, 4)
    assert not check_nm(permuted, 2, 4)  # in the stored order it is not 2:4 (the deployment permutes the inputs)
    ranked = torch.sort(scores.sum(0), stable=True).indices
    assert order[0] == ranked[0] and order[1] == ranked[32 - 1]  # slot 1 takes its quarter in descending order


def test_reallocation_order_refuses_widths_not_a_multiple_of_m() -> None:
    with pytest.raises(ValueError, match="multiple of M=4"):
        reallocation_order(torch.rand(3, 6), 4)


def test_config_refusals() -> None:
    with pytest.raises(ValueError, match="pruner.a=-1"):
        RIAConfig(a=-1)
    with pytest.raises(ValueError, match="pruner.scope='column'"):
        RIAConfig(scope="column")
    with pytest.raises(ValueError, match="pruner.permute=true reorders channels for N:M only"):
        RIA(RIAConfig(permute=True)).check(U50)
    RIA(RIAConfig(permute=True)).check(NM24)  # control: N:M accepted


def test_hydra_composes_the_option() -> None:
    out = subprocess.run([sys.executable, "prune.py", "model=tiny", "pruner=ria", "pruner.permute=true",
                          "sparsity=nm2_4", "--cfg", "job"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "name: ria" in out.stdout and "permute: true" in out.stdout and "a: 0.5" in out.stdout
