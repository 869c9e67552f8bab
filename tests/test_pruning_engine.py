"""The sequential engine on tiny random LLaMA models: N:M validity, Wanda vs a direct computation, propagation
through pruned blocks, no-op pruners, SPP-injected names and early, clear errors."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from spp.models import tiny_llama
from spp.paths import SAMPLE_DATA_DIR
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig, check_nm, current_masks, prune_model
from spp.pruning.calibration_data import draw_calibration
from spp.pruning.patterns import prune_lowest_per_row
from spp.pruning.registry import pruner_config

CAL = CalibrationConfig(nsamples=4, seqlen=64, batch_size=2)
U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)
BLOCK0 = [f"model.layers.0.{n}" for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                            "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
BLOCK1 = [n.replace("layers.0", "layers.1") for n in BLOCK0]


def _prune(model: nn.Module, tok, pruner: str | dict, sparsity: SparsityConfig | dict, cal: CalibrationConfig = CAL):
    """``prune_model`` with the configs built here (a dict is built inside the test, where its error is expected)."""
    cfg = PrunerConfig(name=pruner) if isinstance(pruner, str) else pruner_config(**pruner)
    sparsity = SparsityConfig(**sparsity) if isinstance(sparsity, dict) else sparsity
    return prune_model(model, tok, cfg, sparsity, cal, data_dir=SAMPLE_DATA_DIR, device="cpu")


def _inputs_of(model: nn.Module, windows: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """Inputs (tokens x in) of the named linears during one plain full-model forward pass."""
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    handles = [
        model.get_submodule(n).register_forward_hook(lambda _m, i, _o, n=n: seen[n].append(i[0].detach()))
        for n in names
    ]
    with torch.no_grad():
        model(input_ids=windows, use_cache=False)
    for h in handles:
        h.remove()
    return {n: torch.cat(x).reshape(-1, x[0].shape[-1]) for n, x in seen.items()}


def _direct_wanda(weight: torch.Tensor, x: torch.Tensor, nsamples: int, ratio: float) -> torch.Tensor:
    norm_sq = ((x.double() ** 2).sum(0) / nsamples).float()
    return prune_lowest_per_row(weight.abs().float() * norm_sq.sqrt().reshape(1, -1), ratio)


@pytest.mark.parametrize("pruner", ["magnitude", "wanda", "sparsegpt", "dsnot"])
@pytest.mark.parametrize(("n", "m"), [(2, 4), (4, 8), (2, 8)])
def test_every_nm_group_is_valid_for_every_pruner(tiny_tok, pruner: str, n: int, m: int) -> None:
    model = tiny_llama(seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    cal = CalibrationConfig(nsamples=2, seqlen=32)
    result = _prune(model, tiny_tok, pruner, SparsityConfig(name=f"nm{n}_{m}", kind="nm", n=n, m=m), cal)
    assert len(result.masks) == 7
    for name, mask in result.masks.items():
        weight = model.get_submodule(name).weight
        assert check_nm(weight, n, m), name
        mask_audit = check_nm(mask, n, m)
        assert mask_audit.exact_groups == mask_audit.groups, name
        assert torch.equal(weight[~mask], torch.zeros(int((~mask).sum())))
    assert result.report.overall["nm_valid"] is True
    assert result.report.overall["sparsity"] >= 1 - n / m


def test_wanda_masks_equal_a_direct_computation_with_pruned_propagation(tiny_tok) -> None:
    model = tiny_llama(seed=0)
    dense = copy.deepcopy(model)
    ratio = 0.75
    sparsity = SparsityConfig(name="unstructured75", kind="unstructured", ratio=ratio)
    result = _prune(model, tiny_tok, "wanda", sparsity)
    windows = draw_calibration(tiny_tok, CAL, SAMPLE_DATA_DIR).windows
    dense_inputs = _inputs_of(dense, windows, BLOCK0 + BLOCK1)
    for name in BLOCK0:  # block 0 sees the embeddings: same inputs as the dense model
        expected = _direct_wanda(dense.get_submodule(name).weight, dense_inputs[name], 4, ratio)
        assert torch.equal(result.masks[name], expected), name
    half_pruned = copy.deepcopy(dense)  # block 0 pruned, block 1 dense: block 1's inputs in the sequential engine
    with torch.no_grad():
        for name in BLOCK0:
            half_pruned.get_submodule(name).weight.mul_(result.masks[name])
    differs_from_dense_propagation = 0
    sequential_inputs = _inputs_of(half_pruned, windows, BLOCK1)
    for name in BLOCK1:
        weight = dense.get_submodule(name).weight
        expected = _direct_wanda(weight, sequential_inputs[name], 4, ratio)
        assert torch.equal(result.masks[name], expected), name
        dense_inputs_mask = _direct_wanda(weight, dense_inputs[name], 4, ratio)
        differs_from_dense_propagation += int(not torch.equal(result.masks[name], dense_inputs_mask))
    assert differs_from_dense_propagation >= 3


def test_true_sequential_calibrates_o_proj_after_qkv_are_pruned(tiny_tok) -> None:
    model = tiny_llama(seed=0)
    dense = copy.deepcopy(model)
    result = _prune(model, tiny_tok, {"name": "wanda", "true_sequential": True}, U50)
    windows = draw_calibration(tiny_tok, CAL, SAMPLE_DATA_DIR).windows
    qkv_pruned = copy.deepcopy(dense)
    with torch.no_grad():
        for name in BLOCK0[:3]:
            qkv_pruned.get_submodule(name).weight.mul_(result.masks[name])
    o_proj = BLOCK0[3]
    x = _inputs_of(qkv_pruned, windows, [o_proj])[o_proj]
    expected = _direct_wanda(dense.get_submodule(o_proj).weight, x, 4, 0.5)
    assert torch.equal(result.masks[o_proj], expected)


@pytest.mark.parametrize(("pruner", "sparsity"), [("none", U50), ("wanda", SparsityConfig())])
def test_noop_pruning_returns_all_true_masks_and_leaves_weights(tiny_tok, pruner: str, sparsity) -> None:
    model = tiny_llama(seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = _prune(model, tiny_tok, pruner, sparsity)
    assert len(result.masks) == 14 and all(bool(m.all()) for m in result.masks.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_only_configured_targets_are_pruned(tiny_tok) -> None:
    model = tiny_llama(seed=0).train()
    result = _prune(model, tiny_tok, {"name": "magnitude", "targets": ["q_proj", "down_proj"]}, U50)
    assert sorted(result.masks) == sorted(n for n in BLOCK0 + BLOCK1 if n.endswith(("q_proj", "down_proj")))
    assert bool((model.model.layers[0].self_attn.k_proj.weight != 0).all())
    assert model.training  # the caller's mode is restored
    fresh = tiny_llama(seed=0)
    assert torch.equal(model.lm_head.weight, fresh.lm_head.weight)
    assert torch.equal(model.model.embed_tokens.weight, fresh.model.embed_tokens.weight)


class _Injected(nn.Module):
    """Stand-in for an SPP layer: the pruned linear lives at ``.base``."""

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base = base
        self.alpha = nn.Parameter(torch.ones(4, base.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x)


def test_current_masks_maps_injected_base_weights_back_to_the_linear_name(tiny_tok) -> None:
    model = tiny_llama(seed=0)
    result = _prune(model, tiny_tok, "magnitude", U50)
    attn = model.model.layers[0].self_attn
    attn.q_proj = _Injected(attn.q_proj)
    masks = current_masks(model)
    assert sorted(masks) == sorted(result.masks)
    assert all(torch.equal(masks[k], result.masks[k]) for k in masks)


def test_report_lists_every_layer_with_exact_zero_fraction(tiny_tok) -> None:
    model = tiny_llama(seed=0)
    result = _prune(model, tiny_tok, "sparsegpt", U50)
    rows = {row["name"]: row for row in result.report.layers}
    assert sorted(rows) == sorted(BLOCK0 + BLOCK1)
    for name, row in rows.items():
        assert row["sparsity"] == float((model.get_submodule(name).weight == 0).float().mean())
    assert "obs_loss" in rows[BLOCK0[0]] and result.timings["statistics"] > 0
    json.dumps(dataclasses.asdict(result.report))
    assert result.report.to_markdown().count("\n") == 14 + 2


def _count_forwards(model: nn.Module) -> list[int]:
    calls = [0]
    model.model.embed_tokens.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize(
    ("pruner", "sparsity", "cal", "error", "match"),
    [
        ("wanda", SparsityConfig(name="nm1_3", kind="nm", n=1, m=3), CAL, ValueError,
         r"layer model\.layers\.0\.self_attn\.q_proj has in_features=64, not a multiple of M=3"),
        ("wanda", U50, CalibrationConfig(seqlen=1024), ValueError,
         r"calibration\.seqlen=1024 exceeds the model's max_position_embeddings=512"),
        ({"name": "wanda", "targets": ["qkv"]}, U50, CAL, ValueError, r"pruner\.targets: 'qkv' matches no module"),
        ({"name": "sparsegpt", "blocksize": 30}, SparsityConfig(name="nm2_4", kind="nm", n=2, m=4), CAL, ValueError,
         r"pruner\.blocksize=30 must be a multiple of sparsity\.m=4"),
        ("wanda", {"name": "u", "kind": "unstructured", "ratio": 1.0}, CAL, ValueError, r"sparsity\.ratio=1\.0"),
        ("wanda", U50, CalibrationConfig(source="wikitext3", seqlen=64), FileNotFoundError,
         r"calibration\.source='wikitext3'"),
    ],
)
def test_bad_input_fails_early_with_a_clear_error(tiny_tok, pruner, sparsity, cal, error, match) -> None:
    model = tiny_llama(seed=0)
    calls = _count_forwards(model)
    with pytest.raises(error, match=match):
        _prune(model, tiny_tok, pruner, sparsity, cal)
    assert calls[0] == 0


def test_too_short_calibration_text_is_rejected(tiny_tok, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("only a few bytes")
    with pytest.raises(ValueError, match=r"has only 16 tokens, not more than calibration\.seqlen=64"):
        _prune(tiny_llama(), tiny_tok, "wanda", U50, CalibrationConfig(source=str(short), nsamples=2, seqlen=64))
    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"text": "x" * 50}) for _ in range(3)))
    with pytest.raises(ValueError, match=r"no document in .* is longer than calibration\.seqlen=64 tokens"):
        _prune(tiny_llama(), tiny_tok, "wanda", U50,
               CalibrationConfig(source=str(docs), nsamples=2, seqlen=64, sampling="document"))
