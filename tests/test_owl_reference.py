"""OWL's per-block ratios and masks against the authors' code (tests/fixtures/README.md: how, at which commit).

Agreement on the tiny LLaMA (4 blocks, 70 %, λ = 0.08, M = 5): the four outlier ratios are equal to the last bit;
the Wanda masks (per-row comparison at each block's ratio) are identical; the magnitude masks (one threshold per
matrix) differ by exactly one weight per matrix, the extra weight the reference's ``<=`` threshold prunes (magnitude
reads no activations, so nothing propagates).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.pruning import CalibrationConfig, PruneResult, SparsityConfig, prune_model
from spp.pruning.registry import pruner_config

FIXTURE = Path(__file__).parent / "fixtures" / "ria_owl_reference_masks.safetensors"
CALIBRATION = CalibrationConfig(source="c4", nsamples=4, seqlen=64, seed=0)
U70_OWL = SparsityConfig(name="unstructured70", kind="unstructured", ratio=0.7, layerwise="owl")


def prune(name: str, sparsity: SparsityConfig = U70_OWL) -> PruneResult:
    return prune_model(tiny_llama(num_hidden_layers=4), tiny_tokenizer(), pruner_config(name), sparsity, CALIBRATION,
                       device="cpu")


def differing(tag: str, result: PruneResult) -> dict[str, torch.Tensor]:
    """Per linear: entries where spp's mask and the fixture's differ (True = differs), and their direction."""
    ref = load_file(str(FIXTURE))
    out = {}
    for name in result.masks:
        mask = result.masks[name]
        bits = np.unpackbits(ref[f"{tag}/{name}"].numpy())[: mask.numel()].astype(bool)
        theirs = torch.from_numpy(bits).view_as(mask)
        out[name] = (mask != theirs, mask & ~theirs)
    return out


@pytest.mark.parametrize("name", ["wanda", "magnitude"])
def test_outlier_ratios_and_masks_match_the_reference(name: str) -> None:
    result = prune(name)
    tag = f"owl_{name}_unstructured70"
    layerwise = result.report.overall["layerwise"]
    assert layerwise["outlier_ratio_pct"] == load_file(str(FIXTURE))[f"{tag}/outlier_ratio_pct"].tolist()
    blocks = layerwise["block_sparsity"]
    assert sum(blocks) / len(blocks) == pytest.approx(0.7, abs=1e-12)
    assert max(blocks) - min(blocks) == pytest.approx(2 * 0.08, abs=1e-12)
    diff = differing(tag, result)
    if name == "wanda":
        assert sum(int(d.sum()) for d, _ in diff.values()) == 0
    else:  # one weight per matrix: the reference's `<=` threshold
        assert all(int(d.sum()) == 1 and int(kept.sum()) == 1 for d, kept in diff.values())


def test_uniform_masks_differ_from_the_owl_reference() -> None:
    """Negative control: Wanda at a uniform 70 % is not what OWL's reference produced."""
    result = prune("wanda", dataclasses.replace(U70_OWL, layerwise="none"))
    assert sum(int(d.sum()) for d, _ in differing("owl_wanda_unstructured70", result).values()) > 1000
