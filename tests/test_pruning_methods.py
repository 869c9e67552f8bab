"""SparseGPT, Wanda, magnitude and DS⊘T on synthetic layers with correlated inputs."""

from __future__ import annotations

import pytest
import torch

from spp.pruning import SparsityConfig, check_nm
from spp.pruning.pruners.dsnot import dsnot_refine, expected_error
from spp.pruning.pruners.magnitude import magnitude_mask
from spp.pruning.pruners.sparsegpt import sparsegpt_prune
from spp.pruning.pruners.wanda import wanda_mask, wanda_scores
from spp.pruning.statistics import InputStatistics

U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)
NM24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)


def _correlated_layer(n_in: int = 128, out: int = 48, seqs: int = 8, seqlen: int = 256, mean: float = 0.0):
    """A weight and inputs X (seqs, seqlen, n_in) with mixed (correlated) features of very different scales."""
    g = torch.Generator().manual_seed(0)
    mixing = torch.randn(n_in // 4, n_in, generator=g)  # features share n_in / 4 latent factors
    scales = torch.logspace(-1, 1, n_in)[torch.randperm(n_in, generator=g)]
    offsets = mean * torch.randn(n_in, generator=g)
    latent = torch.randn(seqs * seqlen, n_in // 4, generator=g) @ mixing
    x = (latent + 0.3 * torch.randn(seqs * seqlen, n_in, generator=g)) * scales + offsets
    weight = torch.randn(out, n_in, generator=g)
    stats = InputStatistics(n_in, "cpu", hessian=True, moments=True)
    stats.add(x.reshape(seqs, seqlen, n_in))
    return weight, x, stats


def _recon_error(weight: torch.Tensor, pruned: torch.Tensor, x: torch.Tensor) -> float:
    return float(torch.linalg.norm((weight - pruned) @ x.T))


def test_statistics_match_direct_formulas() -> None:
    weight, x, stats = _correlated_layer(n_in=16, seqs=4, seqlen=32)
    x64 = x.double()
    torch.testing.assert_close(stats.input_norm_sq.double(), (x64**2).sum(0) / 4, rtol=1e-5, atol=0)
    torch.testing.assert_close(stats.hessian.double(), 2 / 4 * x64.T @ x64, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(stats.sequence_sum.double(), x64.sum(0) / 4, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.var.double(), x64.var(0, unbiased=False), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("sparsity", [U50, NM24], ids=["unstructured50", "2:4"])
def test_sparsegpt_reconstructs_better_than_wanda_better_than_magnitude(sparsity: SparsityConfig) -> None:
    weight, x, stats = _correlated_layer()
    magnitude = weight * magnitude_mask(weight, sparsity)
    wanda = weight * wanda_mask(weight, stats.input_norm_sq, sparsity)
    sgpt = sparsegpt_prune(weight, stats.hessian, sparsity, blocksize=32)
    for pruned in (magnitude, wanda, sgpt.weight):
        assert int((pruned == 0).sum()) == pytest.approx(weight.numel() * 0.5, abs=1)
    pruned_weights = {"mag": magnitude, "wanda": wanda, "sgpt": sgpt.weight}
    errors = {name: _recon_error(weight, w, x) for name, w in pruned_weights.items()}
    assert errors["sgpt"] < 0.8 * errors["wanda"], errors
    assert errors["wanda"] < 0.8 * errors["mag"], errors
    if sparsity.kind == "nm":
        assert check_nm(sgpt.weight, 2, 4).exact_groups == weight.numel() // 4
    torch.testing.assert_close(sgpt.weight[~sgpt.mask], torch.zeros(int((~sgpt.mask).sum())))


def test_sparsegpt_unstructured_prunes_the_ratio_of_every_column_block() -> None:
    weight, _x, stats = _correlated_layer(n_in=96)
    out = sparsegpt_prune(weight, stats.hessian, SparsityConfig(name="u", kind="unstructured", ratio=0.7), blocksize=32)
    for start in range(0, 96, 32):
        assert int((~out.mask[:, start : start + 32]).sum()) == int(48 * 32 * 0.7)


def test_sparsegpt_single_pruned_weight_matches_the_obs_update() -> None:
    hessian = torch.tensor([[2.0, 0.6], [0.6, 1.0]])
    weight = torch.tensor([[0.1, 2.0]])
    out = sparsegpt_prune(weight, hessian, SparsityConfig(name="u", kind="unstructured", ratio=0.5), percdamp=0.01)
    damped = hessian + 0.01 * hessian.diagonal().mean() * torch.eye(2)
    expected = 2.0 + 0.1 * damped[0, 1] / damped[1, 1]  # argmin over w1 of (w - ŵ)ᵀ H (w - ŵ) with ŵ0 = 0
    assert out.mask.tolist() == [[False, True]]
    torch.testing.assert_close(out.weight, torch.tensor([[0.0, float(expected)]]))


def test_sparsegpt_zeroes_dead_inputs_and_rejects_misaligned_blocks() -> None:
    weight, x, _ = _correlated_layer(n_in=32)
    x[:, 5] = 0
    stats = InputStatistics(32, "cpu", hessian=True)
    stats.add(x)
    out = sparsegpt_prune(weight, stats.hessian, U50, blocksize=16)
    assert (out.weight[:, 5] == 0).all()
    with pytest.raises(ValueError, match="pruner.blocksize=30 must be a multiple of sparsity.m=4"):
        sparsegpt_prune(weight, stats.hessian, NM24, blocksize=30)


def _dsnot(sparsity: SparsityConfig, **kwargs):
    weight, x, stats = _correlated_layer(mean=1.0)
    metric = wanda_scores(weight, stats.input_norm_sq)
    result = dsnot_refine(weight, metric, metric, stats.sequence_sum, stats.var, sparsity, **kwargs)
    return weight, x, stats, result


@pytest.mark.parametrize("same_sign_check", [False, True])
def test_dsnot_keeps_per_row_sparsity_and_lowers_its_objective(same_sign_check: bool) -> None:
    sparsity = SparsityConfig(name="u75", kind="unstructured", ratio=0.75)
    weight, x, stats, result = _dsnot(sparsity, same_sign_check=same_sign_check, update_threshold=1e-3)
    assert ((~result.mask).sum(1) == int(128 * 0.75)).all()
    assert not torch.equal(result.mask, wanda_mask(weight, stats.input_norm_sq, sparsity))
    # the objective: e_i = Σ_{j pruned} W_ij · (mean over sequences of Σ_tokens x_j), computed directly
    seq_sum = x.double().reshape(8, 256, -1).sum(1).mean(0)
    direct = ((weight.double() * ~result.mask) * seq_sum).sum(1)
    torch.testing.assert_close(result.error_after.double(), direct, rtol=1e-4, atol=1e-2)
    assert (result.error_after.abs() <= result.error_before.abs() + 1e-4).all()
    assert result.error_after.abs().sum() < 0.5 * result.error_before.abs().sum()


def test_dsnot_nm_keeps_every_group_valid_and_lowers_its_objective() -> None:
    weight, _x, stats, result = _dsnot(NM24, update_threshold=1e-3)
    audit = check_nm(result.mask, 2, 4)
    assert audit and audit.exact_groups == audit.groups
    assert not torch.equal(result.mask, wanda_mask(weight, stats.input_norm_sq, NM24))
    assert (result.error_after.abs() <= result.error_before.abs() + 1e-4).all()
    assert result.error_after.abs().sum() < result.error_before.abs().sum()
    torch.testing.assert_close(result.error_after, expected_error(weight, stats.sequence_sum, result.mask))


def test_dsnot_with_a_huge_threshold_returns_the_initial_mask() -> None:
    weight, _x, stats, result = _dsnot(U50, update_threshold=1e12)
    assert result.cycles == 0
    assert torch.equal(result.mask, wanda_mask(weight, stats.input_norm_sq, U50))
    torch.testing.assert_close(result.error_after, result.error_before)


def test_tiny_op_loops_run_single_threaded_on_cpu_and_restore_the_setting() -> None:
    from spp.pruning.threads import one_cpu_thread

    before = torch.get_num_threads()
    with one_cpu_thread("cpu"):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with one_cpu_thread("meta"):
        assert torch.get_num_threads() == before
