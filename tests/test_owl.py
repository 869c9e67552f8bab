"""OWL's layer-wise ratios (spp/pruning/layerwise.py): Eq. 3's normalisation, the config's refusals, the cache key,
and a pruning run whose blocks get their own ratios."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from spp.models.config import ModelConfig
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.pruning import CalibrationConfig, SparsityConfig, prune_model
from spp.pruning.cache import cache_key
from spp.pruning.layerwise import outlier_ratio, owl_ratios
from spp.pruning.registry import pruner_config

U70 = SparsityConfig(name="unstructured70", kind="unstructured", ratio=0.7)


def test_ratios_keep_the_mean_and_span_two_lambda() -> None:
    ratios = owl_ratios([0.9, 1.4, 2.0, 1.1], target=0.7, lam=0.08)
    assert sum(ratios) / 4 == pytest.approx(0.7, abs=1e-12)
    assert max(ratios) - min(ratios) == pytest.approx(0.16, abs=1e-12)
    assert ratios[2] == min(ratios) and ratios[0] == max(ratios)  # more outliers: fewer weights pruned
    assert owl_ratios([1.0, 1.0, 1.0], target=0.5, lam=0.08) == [0.5, 0.5, 0.5]


def test_outlier_ratio_counts_scores_above_m_times_the_mean() -> None:
    scores = [torch.tensor([[1.0, 1.0, 1.0, 1.0]]), torch.tensor([[1.0, 1.0, 1.0, 13.0]])]  # mean 2.5
    assert outlier_ratio(scores, 5.0) == pytest.approx(100 / 8)
    assert outlier_ratio(scores, 6.0) == 0.0  # 13 is not above 6 x 2.5


def test_refusals_name_the_key() -> None:
    with pytest.raises(ValueError, match="sparsity.layerwise=owl .* unstructured sparsity only"):
        SparsityConfig(name="nm2_4", kind="nm", n=2, m=4, layerwise="owl")
    with pytest.raises(ValueError, match="sparsity.owl_lambda=0.2"):
        dataclasses.replace(U70, layerwise="owl", owl_lambda=0.2)  # 0.7 + 2 x 0.2 > 1
    with pytest.raises(ValueError, match="sparsity.layerwise='bogus'"):
        dataclasses.replace(U70, layerwise="bogus")
    assert dataclasses.replace(U70, layerwise="owl").layerwise == "owl"  # control: accepted


def test_cache_key_changes_only_with_owl() -> None:
    model = ModelConfig(name="tiny", path="tiny")
    calibration = CalibrationConfig(source="c4", nsamples=4, seqlen=64)
    uniform, _ = cache_key(model, pruner_config("magnitude"), U70, calibration)
    owl, digest = cache_key(model, pruner_config("magnitude"), dataclasses.replace(U70, layerwise="owl"), calibration)
    assert set(uniform["sparsity"]) == {"kind", "ratio", "n", "m"}  # the keys of existing entries stay as they were
    assert "calibration" not in uniform and "calibration" in owl  # OWL reads activations even for magnitude
    other = cache_key(model, pruner_config("magnitude"), dataclasses.replace(U70, layerwise="owl", owl_m=7.0),
                      calibration)[1]
    assert other != digest


def test_blocks_get_their_own_ratio_and_the_mean_holds() -> None:
    sparsity = dataclasses.replace(U70, layerwise="owl")
    result = prune_model(tiny_llama(num_hidden_layers=4), tiny_tokenizer(), pruner_config("wanda"), sparsity,
                         CalibrationConfig(source="c4", nsamples=4, seqlen=64), device="cpu")
    blocks = result.report.overall["layerwise"]["block_sparsity"]
    per_block = [[r["sparsity"] for r in result.report.layers if f".layers.{i}." in r["name"]] for i in range(4)]
    for ratio, rows in zip(blocks, per_block, strict=True):
        assert all(abs(s - ratio) < 1 / 64 for s in rows)  # per row: int(in_features * ratio) of each row
    assert len(set(blocks)) == 4
    assert abs(result.report.overall["sparsity"] - 0.7) < 0.01
