"""Sparsity patterns, magnitude / Wanda masks on single matrices, N:M audits and config validation."""

from __future__ import annotations

import pytest
import torch

from spp.pruning import SparsityConfig, check_nm, sparsity_summary
from spp.pruning.config import CalibrationConfig, PrunerConfig
from spp.pruning.patterns import keep_top_n_of_m, prune_lowest_per_row
from spp.pruning.pruners.dsnot import DSnoTConfig
from spp.pruning.pruners.magnitude import magnitude_mask
from spp.pruning.pruners.wanda import wanda_mask
from spp.pruning.registry import get_pruner, pruner_config

U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)


def _unstructured(ratio: float) -> SparsityConfig:
    return SparsityConfig(name=f"u{ratio}", kind="unstructured", ratio=ratio)


@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.75])
def test_wanda_unstructured_prunes_exactly_the_ratio_in_every_row(ratio: float) -> None:
    torch.manual_seed(0)
    weight = torch.randn(24, 40) * torch.logspace(-2, 1, 24).unsqueeze(1)  # rows of very different scale
    norms = torch.rand(40) * 10
    keep = wanda_mask(weight, norms, _unstructured(ratio))
    assert ((~keep).sum(1) == int(40 * ratio)).all()
    scores = weight.abs() * norms.sqrt()
    for row in range(24):
        assert scores[row][~keep[row]].max() <= scores[row][keep[row]].min()


def test_magnitude_unstructured_uses_one_threshold_per_matrix() -> None:
    torch.manual_seed(1)
    weight = torch.randn(16, 32) * torch.linspace(0.1, 3.0, 16).unsqueeze(1)
    keep = magnitude_mask(weight, U50)
    assert int((~keep).sum()) == int(weight.numel() * 0.5)
    assert weight.abs()[~keep].max() <= weight.abs()[keep].min()
    per_row = (~keep).sum(1)
    assert per_row[0] > per_row[-1]  # small-scale rows lose more: the threshold is not per row


@pytest.mark.parametrize(("n", "m"), [(2, 4), (4, 8), (2, 8), (1, 4)])
def test_nm_keeps_the_n_largest_of_every_group(n: int, m: int) -> None:
    torch.manual_seed(2)
    scores = torch.rand(8, 32)
    keep = keep_top_n_of_m(scores, n, m)
    groups_keep, groups_score = keep.reshape(8, -1, m), scores.reshape(8, -1, m)
    assert (groups_keep.sum(-1) == n).all()
    kept_min = torch.where(groups_keep, groups_score, torch.inf).amin(-1)
    pruned_max = torch.where(groups_keep, -torch.inf, groups_score).amax(-1)
    assert (pruned_max <= kept_min).all()
    audit = check_nm(keep, n, m)
    assert audit and audit.violations == 0 and audit.exact_groups == audit.groups == 8 * 32 // m


def test_check_nm_counts_violating_groups_on_masks_and_weights() -> None:
    keep = keep_top_n_of_m(torch.rand(4, 16), 2, 4)
    keep[1, 4:8] = True  # one group with 4 kept
    keep[3, 0:4] = True
    audit = check_nm(keep, 2, 4)
    assert not audit and audit.violations == 2 and audit.groups == 16
    weight = torch.randn(4, 16) * keep
    assert check_nm(weight, 2, 4).violations == 2
    with pytest.raises(ValueError, match="M=3: in_features=16 is not a multiple"):
        check_nm(keep, 2, 3)


def test_per_row_selection_breaks_ties_by_column() -> None:
    keep = prune_lowest_per_row(torch.zeros(2, 6), 0.5)
    assert keep.tolist() == [[False, False, False, True, True, True]] * 2


def test_sparsity_summary_counts_exact_zeros_and_audits_groups() -> None:
    weight = torch.tensor([[1.0, 0.0, 0.0, 2.0], [0.0, 0.0, 3.0, 0.0]])
    summary = sparsity_summary({"a": weight, "b": torch.ones(2, 4, dtype=torch.bool)}, n=2, m=4)
    assert summary["layers"]["a"]["zeros"] == 5 and summary["layers"]["a"]["nm_valid"]
    assert summary["layers"]["b"]["zeros"] == 0 and summary["layers"]["b"]["nm_violations"] == 2
    assert summary["overall"]["sparsity"] == pytest.approx(5 / 16)
    assert summary["overall"]["nm_valid"] is False


@pytest.mark.parametrize("ratio", [0.0, 1.0, 1.5, -0.1, None])
def test_unstructured_ratio_outside_open_interval_is_rejected(ratio: float | None) -> None:
    with pytest.raises(ValueError, match=r"sparsity.ratio=.* strictly between 0 and 1"):
        SparsityConfig(name="bad", kind="unstructured", ratio=ratio).validate()


@pytest.mark.parametrize(("n", "m"), [(4, 4), (5, 4), (0, 4)])
def test_invalid_nm_is_rejected(n: int, m: int) -> None:
    with pytest.raises(ValueError, match="need 1 <= n < m"):
        SparsityConfig(name="bad", kind="nm", n=n, m=m).validate()


def test_nm_ratio_and_convention() -> None:
    assert SparsityConfig(name="nm2_8", kind="nm", n=2, m=8).validate().target_ratio == 0.75
    with pytest.raises(ValueError, match="contradicts"):
        SparsityConfig(name="x", kind="nm", n=2, m=4, ratio=0.75).validate()
    with pytest.raises(ValueError, match="sparsity.kind"):
        SparsityConfig(name="x", kind="blocky").validate()


def test_pruner_and_calibration_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="pruner.name='obs' is not a pruner"):
        get_pruner(PrunerConfig(name="obs").validate())
    with pytest.raises(ValueError, match="pruner.initial_method"):
        pruner_config("dsnot", initial_method="random")
    with pytest.raises(ValueError, match="pruner.name='wanda' in the config of pruner=dsnot"):
        DSnoTConfig(name="wanda")
    with pytest.raises(TypeError, match="blocksize"):
        pruner_config("wanda", blocksize=64)  # Wanda has no such setting
    with pytest.raises(ValueError, match="calibration.nsamples"):
        CalibrationConfig(nsamples=0).validate()
    with pytest.raises(ValueError, match="calibration.sampling"):
        CalibrationConfig(sampling="shuffle").validate()
