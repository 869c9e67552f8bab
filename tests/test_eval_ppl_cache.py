"""The perplexity cache: keyed on the data file's sha256 and the weights, never stores a non-finite value."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from spp.distributed import DistContext
from spp.eval.config import EvalConfig
from spp.eval.offloaded import cached_offloaded_perplexity
from spp.eval.perplexity import perplexity
from spp.eval.ppl_cache import ppl_cache_key
from spp.models.config import ModelConfig
from spp.models.offload import OffloadedModel
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.training.callbacks.pruning import ppl_log_text
from tests.test_cache_keys import weights_key

EVAL = EvalConfig(seqlen=64, max_windows=2)
TINY = ModelConfig(name="tiny", path="tiny")


def _entries(cache_dir) -> list:
    return sorted((cache_dir / "ppl").glob("*.json"))


def test_second_call_hits_and_returns_the_measured_number(tiny_model, tiny_tok, sample_data_dir, tmp_path):
    direct = perplexity(tiny_model, tiny_tok, seqlen=64, max_windows=2, data_dir=sample_data_dir)
    off = OffloadedModel(tiny_model, DistContext())
    first = cached_offloaded_perplexity(off, tiny_tok, EVAL, "w", tmp_path, sample_data_dir)
    second = cached_offloaded_perplexity(off, tiny_tok, EVAL, "w", tmp_path, sample_data_dir)
    assert (first["cache_hit"], second["cache_hit"]) == (False, True)
    assert first["ppl"] == second["ppl"] == pytest.approx(direct.ppl, rel=1e-6) and len(_entries(tmp_path)) == 1
    other = cached_offloaded_perplexity(off, tiny_tok, EvalConfig(seqlen=64, max_windows=3), "w", tmp_path,
                                        sample_data_dir)
    assert other["cache_hit"] is False and other["windows"] == 3 and len(_entries(tmp_path)) == 2


def test_a_hit_reports_this_runs_seconds_and_keeps_the_measured_ones_apart(tiny_model, tiny_tok, sample_data_dir,
                                                                           tmp_path):
    off = OffloadedModel(tiny_model, DistContext())
    miss = cached_offloaded_perplexity(off, tiny_tok, EVAL, "w", tmp_path, sample_data_dir)
    assert miss["cache_hit"] is False and "cached_seconds" not in miss and miss["seconds"] >= 0
    entry = _entries(tmp_path)[0]
    stored = json.loads(entry.read_text())
    assert stored["seconds"] == miss["seconds"]  # the entry keeps the time of the computation it holds
    entry.write_text(json.dumps({**stored, "seconds": 987.65}))  # a computation that took long
    hit = cached_offloaded_perplexity(off, tiny_tok, EVAL, "w", tmp_path, sample_data_dir)
    assert hit["cache_hit"] is True and hit["ppl"] == miss["ppl"]
    assert hit["seconds"] < 60 and hit["cached_seconds"] == 987.65  # this run read it; the measurement is kept
    line = ppl_log_text(hit)
    assert "987.6" not in line.split("cached")[0] and "cached" in line, line


def test_key_follows_the_file_content_not_the_source_name_or_directory(sample_data_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(sample_data_dir / "wikitext2", copy / "wikitext2")
    assert ppl_cache_key("w", EVAL, copy) == ppl_cache_key("w", EVAL, sample_data_dir)  # same bytes elsewhere
    as_path = EvalConfig(seqlen=64, max_windows=2, ppl_source=str(copy / "wikitext2" / "test.json"))
    assert ppl_cache_key("w", as_path, None) == ppl_cache_key("w", EVAL, sample_data_dir)  # same reader, same bytes
    rows = (copy / "wikitext2" / "test.json").read_text().splitlines()
    (copy / "wikitext2" / "test.json").write_text("\n".join([json.dumps({"text": "changed"}), *rows[1:]]) + "\n")
    assert ppl_cache_key("w", EVAL, copy) != ppl_cache_key("w", EVAL, sample_data_dir)  # same name, other bytes
    assert ppl_cache_key("w2", EVAL, sample_data_dir) != ppl_cache_key("w", EVAL, sample_data_dir)
    c4 = EvalConfig(seqlen=64, max_windows=2, ppl_source="c4")
    assert ppl_cache_key("w", c4, sample_data_dir) != ppl_cache_key("w", EVAL, sample_data_dir)
    with pytest.raises(FileNotFoundError, match="eval.ppl_source='/nonexistent.jsonl' does not exist"):
        ppl_cache_key("w", EvalConfig(ppl_source="/nonexistent.jsonl"), None)


def test_non_finite_perplexity_is_returned_but_not_cached(tiny_model, tiny_tok, sample_data_dir, tmp_path):
    with torch.no_grad():
        tiny_model.lm_head.weight.fill_(float("nan"))
    off = OffloadedModel(tiny_model, DistContext())
    result = cached_offloaded_perplexity(off, tiny_tok, EVAL, "nan-model", tmp_path, sample_data_dir)
    assert result["ppl"] != result["ppl"] and result["cache_hit"] is False  # NaN
    assert _entries(tmp_path) == []


def test_weights_key_is_the_identity_when_dense_and_the_pruning_digest_when_pruned(sample_data_dir):
    dense = weights_key(TINY)
    assert dense == weights_key(TINY, PrunerConfig(name="none"), SparsityConfig()) and dense
    nm24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
    u50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)
    cal = CalibrationConfig(source="c4", nsamples=2, seqlen=64)
    wanda = weights_key(TINY, PrunerConfig(name="wanda"), nm24, cal, str(sample_data_dir))
    assert len(wanda) == 64 and wanda != dense
    assert wanda != weights_key(TINY, PrunerConfig(name="wanda"), u50, cal, str(sample_data_dir))
    more_samples = CalibrationConfig(source="c4", nsamples=4, seqlen=64)
    assert wanda != weights_key(TINY, PrunerConfig(name="wanda"), nm24, more_samples, str(sample_data_dir))
