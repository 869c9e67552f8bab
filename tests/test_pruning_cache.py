"""The pruning cache: a hit applies the stored state without any calibration forward pass; a truncated or partial
entry is detected and rebuilt; the list / clear command."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import spp.models.block_runner as sequential
from spp.models import ModelConfig, tiny_llama
from spp.paths import SAMPLE_DATA_DIR
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.cache import cache_key
from spp.pruning.cache.__main__ import main as cache_cli
from spp.pruning.cache.store import MANIFEST_FILE, STATE_FILE, list_entries
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.phase import get_or_reconstruct

CAL = CalibrationConfig(nsamples=4, seqlen=64, batch_size=2)
U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)
TINY = ModelConfig(name="tiny", path="tiny")


def _get(tmp_path: Path, tok, pruner: str = "sparsegpt", cal: CalibrationConfig = CAL, model=None):
    model = model if model is not None else tiny_llama(seed=0)
    result, _ = get_or_reconstruct(model, tok, TINY, PrunerConfig(name=pruner), U50, cal, ReconstructConfig(), tmp_path,
                                   SAMPLE_DATA_DIR, "cpu")
    return model, result


def _forbid_forward(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    model.model.embed_tokens.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    for block in model.model.layers:
        block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    def refuse(*_args, **_kwargs):
        raise AssertionError("calibration capture ran on a cache hit")

    monkeypatch.setattr(sequential.BlockRunner, "head", refuse)
    return calls


def test_cache_hit_restores_the_pruned_state_without_a_forward_pass(tmp_path, tiny_tok, monkeypatch) -> None:
    pruned, first = _get(tmp_path, tiny_tok)
    assert not first.cache_hit and (Path(first.cache_path) / STATE_FILE).is_file()
    fresh = tiny_llama(seed=0)
    calls = _forbid_forward(fresh, monkeypatch)
    _, second = _get(tmp_path, tiny_tok, model=fresh)
    assert second.cache_hit and calls[0] == 0
    assert second.cache_path == first.cache_path
    assert all(torch.equal(first.masks[k], second.masks[k]) for k in first.masks)
    expected = pruned.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in fresh.state_dict().items())  # SparseGPT's updated weights
    assert second.report.overall["sparsity"] == pytest.approx(0.5)


def test_other_settings_use_another_entry(tmp_path, tiny_tok) -> None:
    _, a = _get(tmp_path, tiny_tok, pruner="wanda")
    _, b = _get(tmp_path, tiny_tok, pruner="wanda", cal=CalibrationConfig(nsamples=2, seqlen=64))
    _, c = _get(tmp_path, tiny_tok, pruner="wanda", cal=CalibrationConfig(nsamples=4, seqlen=64, batch_size=4))
    assert not b.cache_hit and a.cache_path != b.cache_path
    assert c.cache_hit and c.cache_path == a.cache_path  # batch size does not change the result
    key, digest = cache_key(TINY, PrunerConfig(name="wanda"), U50, CAL, SAMPLE_DATA_DIR)
    assert key["calibration"]["nsamples"] == 4 and len(key["calibration"]["file_sha256"]) == 64
    assert digest[:16] in a.cache_path


@pytest.mark.parametrize("damage", ["truncate", "drop_manifest", "flip_byte"])
def test_damaged_entry_is_rebuilt_not_used(tmp_path, tiny_tok, damage: str) -> None:
    _, first = _get(tmp_path, tiny_tok, pruner="wanda")
    entry = Path(first.cache_path)
    state = entry / STATE_FILE
    data = state.read_bytes()
    if damage == "truncate":
        state.write_bytes(data[: len(data) // 2])
    elif damage == "drop_manifest":
        (entry / MANIFEST_FILE).unlink()
    else:
        state.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    model, rebuilt = _get(tmp_path, tiny_tok, pruner="wanda")
    assert not rebuilt.cache_hit
    assert state.read_bytes() == data
    assert all(torch.equal(first.masks[k], rebuilt.masks[k]) for k in first.masks)
    _, again = _get(tmp_path, tiny_tok, pruner="wanda")
    assert again.cache_hit


def test_noop_settings_write_no_entry(tmp_path, tiny_tok) -> None:
    model = tiny_llama(seed=0)
    result, _ = get_or_reconstruct(model, tiny_tok, TINY, PrunerConfig(name="none"), U50, CAL, ReconstructConfig(),
                                   tmp_path, SAMPLE_DATA_DIR, "cpu")
    assert result.cache_path is None and list_entries(tmp_path) == []
    assert all(bool(m.all()) for m in result.masks.values())


def test_cache_command_lists_and_clears(tmp_path, tiny_tok, capsys) -> None:
    _get(tmp_path, tiny_tok, pruner="magnitude")
    _get(tmp_path, tiny_tok, pruner="wanda")
    assert cache_cli(["list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "magnitude-unstructured50-" in out and "wanda-unstructured50-" in out and "sparsity 0.5000" in out
    assert cache_cli(["clear", "--cache-dir", str(tmp_path), "--match", "magnitude"]) == 0
    assert [e.name.split("-")[0] for e in list_entries(tmp_path)] == ["wanda"]
    cache_cli(["clear", "--cache-dir", str(tmp_path)])
    assert list_entries(tmp_path) == []
