"""LoSA's RMI layer-wise sparsity (``sparsity.layerwise=rmi``, spp/pruning/layerwise.py): linear CKA against its
definition, the ratios against the reference's solver (scipy SLSQP on the same linear programme), the config's
refusals and cache key, and a pruning run whose blocks get ``ratio ± δ`` with the mean kept."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy import optimize

from spp.models.config import ModelConfig
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.pruning import CalibrationConfig, SparsityConfig, prune_model
from spp.pruning.cache import cache_key
from spp.pruning.layerwise import linear_cka, rmi_importance, rmi_ratios
from spp.pruning.registry import pruner_config

U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)


def hsic_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA from the features with an explicit centring matrix ``H = I − 11ᵀ/n``: ``tr(KHLH)`` normalised."""
    n = x.shape[0]
    h = torch.eye(n, dtype=torch.float64) - torch.full((n, n), 1.0 / n, dtype=torch.float64)
    k, m = h @ (x @ x.t()) @ h, h @ (y @ y.t()) @ h
    return float(torch.trace(k @ m) / torch.sqrt(torch.trace(k @ k) * torch.trace(m @ m)))


def test_linear_cka_is_its_definition():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 20, generator=gen, dtype=torch.float64)
    y = x @ torch.randn(20, 9, generator=gen, dtype=torch.float64) + 0.5 * torch.randn(6, 9, generator=gen,
                                                                                           dtype=torch.float64)
    assert linear_cka(x @ x.t(), y @ y.t()) == pytest.approx(hsic_cka(x, y), rel=1e-12)
    assert linear_cka(x @ x.t(), (3 * x) @ (3 * x).t()) == pytest.approx(1.0)  # invariant to scale
    z = torch.randn(6, 20, generator=gen, dtype=torch.float64)
    assert linear_cka(x @ x.t(), z @ z.t()) < linear_cka(x @ x.t(), y @ y.t())  # control: unrelated is less alike


def slsqp_ratios(importance: list[float], target: float, delta: float) -> list[float]:
    """The reference's solver (their ``lib/prune.py``): SLSQP from ``x0 = 1`` on the same programme."""
    imp = np.array(importance)
    res = optimize.minimize(lambda x: float(x @ imp), x0=[1.0] * len(imp), jac=lambda x: imp, method="SLSQP",
                            bounds=[(target - delta, target + delta)] * len(imp),
                            constraints=({"type": "eq", "fun": lambda x: np.mean(x) - target},))
    assert res.success
    return res.x.tolist()


@pytest.mark.parametrize(("blocks", "target", "delta"), [(4, 0.7, 0.03), (7, 0.5, 0.01), (30, 0.6, 0.02)])
def test_ratios_are_the_references_programme_optimum(blocks, target, delta):
    """Importances spread over [0.3, 0.9], where SLSQP reaches the vertex (on importances that differ by less, as
    ``exp(-t)`` of many alike blocks, it stops short of it: spp solves the programme exactly); the ratios only
    depend on their order."""
    importance = np.random.default_rng(blocks).uniform(0.3, 0.9, blocks).tolist()
    ratios = rmi_ratios(importance, target, delta)
    assert ratios == pytest.approx(slsqp_ratios(importance, target, delta), abs=1e-9)
    assert sum(ratios) / blocks == pytest.approx(target, abs=1e-12)
    assert all(target - delta - 1e-12 <= r <= target + delta + 1e-12 for r in ratios)
    least, most = min(range(blocks), key=importance.__getitem__), max(range(blocks), key=importance.__getitem__)
    assert ratios[least] == pytest.approx(target + delta) and ratios[most] == pytest.approx(target - delta)
    assert rmi_ratios([1.0] * blocks, target, 0.0) == pytest.approx([target] * blocks)  # δ = 0: uniform


def test_importance_is_lowest_for_the_block_most_alike_the_others():
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(8, 30, generator=gen, dtype=torch.float64)
    feats = [base + 0.1 * torch.randn(8, 30, generator=gen, dtype=torch.float64) for _ in range(3)]
    feats.append(torch.randn(8, 30, generator=gen, dtype=torch.float64))  # unlike the others
    importance = rmi_importance([f @ f.t() for f in feats])
    assert max(range(4), key=importance.__getitem__) == 3
    assert rmi_ratios(importance, 0.5, 0.01)[3] == pytest.approx(0.49)  # the distinct block keeps more weights


def test_refusals_delta_and_cache_key():
    with pytest.raises(ValueError, match="sparsity.layerwise=rmi .* unstructured sparsity only"):
        SparsityConfig(name="nm2_4", kind="nm", n=2, m=4, layerwise="rmi")
    with pytest.raises(ValueError, match="sparsity.rmi_delta=0.6"):
        dataclasses.replace(U50, layerwise="rmi", rmi_delta=0.6)
    assert [dataclasses.replace(U50, ratio=r, layerwise="rmi").rmi_spread for r in (0.5, 0.6, 0.7, 0.8)] == [
        0.01, 0.02, 0.03, 0.03]
    model = ModelConfig(name="tiny", path="tiny")
    calibration = CalibrationConfig(source="c4", nsamples=4, seqlen=64)
    keys = {name: cache_key(model, pruner_config("wanda"), dataclasses.replace(U50, layerwise=name), calibration)[1]
            for name in ("none", "owl", "rmi")}
    assert len(set(keys.values())) == 3
    other = cache_key(model, pruner_config("wanda"), dataclasses.replace(U50, layerwise="rmi", rmi_delta=0.02),
                      calibration)[1]
    assert other != keys["rmi"]


def test_blocks_get_ratio_plus_or_minus_delta_and_the_mean_holds():
    sparsity = dataclasses.replace(U50, ratio=0.7, layerwise="rmi")
    result = prune_model(tiny_llama(num_hidden_layers=4), tiny_tokenizer(), pruner_config("wanda"), sparsity,
                         CalibrationConfig(source="c4", nsamples=4, seqlen=64), device="cpu")
    record = result.report.overall["layerwise"]
    blocks = record["block_sparsity"]
    assert record["method"] == "rmi" and record["rmi_delta"] == 0.03 and len(record["rmi_importance"]) == 4
    assert sorted(blocks) == pytest.approx([0.67, 0.67, 0.73, 0.73])
    assert blocks == pytest.approx(rmi_ratios(record["rmi_importance"], 0.7, 0.03))
    per_block = [[r["sparsity"] for r in result.report.layers if f".layers.{i}." in r["name"]] for i in range(4)]
    for ratio, rows in zip(blocks, per_block, strict=True):
        assert all(abs(s - ratio) < 1 / 64 for s in rows)
    assert abs(result.report.overall["sparsity"] - 0.7) < 1 / 64  # each row prunes int(in_features x its ratio)
