"""Every field of the pruning and perplexity cache keys, changed in turn: what changes the result must miss, what
does not must hit (same digest and same entry directory).

The field lists come from ``dataclasses.fields``: a field added to ``PrunerConfig``, ``SparsityConfig``,
``CalibrationConfig`` or ``EvalConfig`` fails ``test_every_config_field_is_classified`` until it is listed below as
changing the result (for which pruners) or not. The "does not" classifications of the pruner settings are also
checked on a real tiny model: pruning with the other value gives the same masks and weights.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

import spp.eval.ppl_cache as ppl_cache
import spp.pruning.cache as pruning_cache
from spp.eval.config import EvalConfig
from spp.eval.ppl_cache import ppl_cache_key, ppl_settings, weights_key
from spp.models.config import ModelConfig
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.paths import SAMPLE_DATA_DIR
from spp.pruning.cache import cache_entry_dir, cache_key
from spp.pruning.config import DSNOT_INITIAL_METHODS, CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model

TINY = ModelConfig(name="tiny", path="tiny")
U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)
NM24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
CAL = CalibrationConfig(source="c4", nsamples=4, seqlen=32, seed=0, batch_size=2)
ROOT = Path("/cache-root")

DSNOT = ("dsnot", "dsnot_sparsegpt")
CALIBRATED = ("wanda", "sparsegpt", *DSNOT)
PRUNERS = {
    "magnitude": PrunerConfig(name="magnitude"),
    "wanda": PrunerConfig(name="wanda"),
    "sparsegpt": PrunerConfig(name="sparsegpt"),
    "dsnot": PrunerConfig(name="dsnot", max_cycles=5),
    "dsnot_sparsegpt": PrunerConfig(name="dsnot", initial_method="sparsegpt", max_cycles=5),
}

# PrunerConfig field -> the pruners (keys of PRUNERS) whose result it changes; () = none.
PRUNER_AFFECTS: dict[str, tuple[str, ...]] = {
    "name": tuple(PRUNERS),
    "targets": tuple(PRUNERS),
    "true_sequential": CALIBRATED,  # the later sublayer groups see the pruned earlier ones
    "blocksize": ("sparsegpt",),  # DS⊘T's SparseGPT initial metric is the whole-matrix w²/U_jj²
    "percdamp": ("sparsegpt", "dsnot_sparsegpt"),
    "initial_method": DSNOT,
    "max_cycles": DSNOT,
    "update_threshold": DSNOT,
    "pow_of_var_regrowing": DSNOT,
    "same_sign_check": DSNOT,
    "refine_targets": DSNOT,
}
OTHER_PRUNER = {"magnitude": "wanda", "wanda": "sparsegpt", "sparsegpt": "dsnot", "dsnot": "wanda"}


def _other_pruner_value(base: PrunerConfig, name: str) -> Any:
    """A valid value of PrunerConfig field ``name`` different from ``base``'s."""
    others: dict[str, Any] = {
        "name": OTHER_PRUNER[base.name],
        "targets": ["q_proj", "up_proj"],
        "true_sequential": not base.true_sequential,
        "blocksize": 64,
        "percdamp": 0.05,
        "initial_method": next(m for m in DSNOT_INITIAL_METHODS if m != base.initial_method),
        "max_cycles": 7,
        "update_threshold": 0.5,
        "pow_of_var_regrowing": 2.0,
        "same_sign_check": not base.same_sign_check,
        "refine_targets": ["q_proj"],
    }
    return others[name]


# SparsityConfig field -> (base, the same with only that field changed, changes the result).
SPARSITY_CASES: dict[str, tuple[SparsityConfig, SparsityConfig, bool]] = {
    "name": (U50, replace(U50, name="half"), False),
    "kind": (SparsityConfig(name="p", kind="nm", ratio=0.5, n=2, m=4),
             SparsityConfig(name="p", kind="unstructured", ratio=0.5, n=2, m=4), True),
    "ratio": (U50, replace(U50, ratio=0.75), True),  # sparsity=unstructured50 sparsity.ratio=0.75
    "n": (NM24, replace(NM24, n=1), True),
    "m": (NM24, replace(NM24, m=8), True),
}

# CalibrationConfig field -> (another value, changes the result of a calibrated pruner).
CALIBRATION_CASES: dict[str, tuple[Any, bool]] = {
    "source": ("wikitext2", True),
    "path": ("alpaca/cleaned_partial/alpaca_data_cleaned_0.json", True),
    "nsamples": (8, True),
    "seqlen": (64, True),
    "seed": (1, True),
    "sampling": ("stream", True),
    "text_field": ("content", True),
    "batch_size": (1, False),  # windows per forward pass: the statistics sum the same tokens
}

# EvalConfig field -> (another value, changes the measured perplexity).
EVAL_BASE = EvalConfig(seqlen=64, max_windows=2)
EVAL_CASES: dict[str, tuple[Any, bool]] = {
    "name": ("quick", False),
    "ppl": (False, False),
    "ppl_source": ("c4", True),
    "extra_ppl_sources": (["c4"], False),  # eval.py's other sources, each measured (and keyed) on its own
    "seqlen": (128, True),
    "max_windows": (3, True),
    "window_sampling": ("systematic", True),
    "batch_size": (2, True),  # same windows, other rounding: kept in the key
    "tasks": (["boolq"], False),
    "limit": (10, False),
    "mmlu_limit": (5, False),
    "doc_seed": (1, False),
    "lm_eval_batch_size": (4, False),
    "online": (True, False),
    "device": ("cpu", False),  # where it runs, like the pruning job's device: rounding only
    "gpus_per_replica": (2, False),  # how the evaluation is spread: the same windows, NLL sums to 1e-6
    "max_memory_per_gpu": ("20GiB", False),  # ... and where a replica's weights sit
}


class Setting(NamedTuple):
    """The arguments of ``cache_key`` / ``weights_key``."""

    model: ModelConfig
    pruner: PrunerConfig
    sparsity: SparsityConfig
    calibration: CalibrationConfig
    data_dir: str = str(SAMPLE_DATA_DIR)


def _hits(a: Setting, b: Setting) -> bool:
    """Whether ``b`` re-uses ``a``'s pruning entry (and pruned-perplexity entries); checks that the entry directory
    and the perplexity cache's weights key agree with the digest."""
    key_a, digest_a = cache_key(*a)
    key_b, digest_b = cache_key(*b)
    same_dir = cache_entry_dir(ROOT, key_a, digest_a) == cache_entry_dir(ROOT, key_b, digest_b)
    assert same_dir == (digest_a == digest_b), "the entry directory must follow the key, never a display name"
    assert (weights_key(*a) == weights_key(*b)) == (digest_a == digest_b)
    return digest_a == digest_b


def test_every_config_field_is_classified() -> None:
    names = {cls: {f.name for f in dataclasses.fields(cls)}
             for cls in (PrunerConfig, SparsityConfig, CalibrationConfig, EvalConfig)}
    assert names[PrunerConfig] == set(PRUNER_AFFECTS), "classify the new PrunerConfig field in PRUNER_AFFECTS"
    assert names[SparsityConfig] == set(SPARSITY_CASES), "classify the new SparsityConfig field in SPARSITY_CASES"
    assert names[CalibrationConfig] == set(CALIBRATION_CASES), "classify the new field in CALIBRATION_CASES"
    assert names[EvalConfig] == set(EVAL_CASES), "classify the new EvalConfig field in EVAL_CASES"
    for pruner in PRUNERS.values():
        assert {_other_pruner_value(pruner, f) != getattr(pruner, f) for f in PRUNER_AFFECTS} == {True}


@pytest.mark.parametrize("field", list(PRUNER_AFFECTS))
@pytest.mark.parametrize("pruner", list(PRUNERS))
def test_pruner_field_changes_the_key_exactly_when_it_changes_the_result(pruner: str, field: str) -> None:
    base = PRUNERS[pruner]
    other = replace(base, **{field: _other_pruner_value(base, field)})
    assert _hits(Setting(TINY, base, U50, CAL), Setting(TINY, other, U50, CAL)) == (pruner not in PRUNER_AFFECTS[field])


@pytest.mark.parametrize("field", list(SPARSITY_CASES))
@pytest.mark.parametrize("pruner", list(PRUNERS))
def test_sparsity_field_changes_the_key_exactly_when_it_changes_the_pattern(pruner: str, field: str) -> None:
    base, other, changes = SPARSITY_CASES[field]
    assert _hits(Setting(TINY, PRUNERS[pruner], base, CAL), Setting(TINY, PRUNERS[pruner], other, CAL)) != changes


@pytest.mark.parametrize("field", list(CALIBRATION_CASES))
@pytest.mark.parametrize("pruner", list(PRUNERS))
def test_calibration_field_changes_the_key_of_calibrated_pruners_only(pruner: str, field: str) -> None:
    value, changes = CALIBRATION_CASES[field]
    a = Setting(TINY, PRUNERS[pruner], NM24, CAL)
    b = Setting(TINY, PRUNERS[pruner], NM24, replace(CAL, **{field: value}))
    assert _hits(a, b) != (changes and pruner in CALIBRATED)


def test_a_sparsity_name_with_another_ratio_misses_and_its_entry_is_labelled_by_the_ratio() -> None:
    wanda = PRUNERS["wanda"]
    half, three_quarters = Setting(TINY, wanda, U50, CAL), Setting(TINY, wanda, replace(U50, ratio=0.75), CAL)
    assert not _hits(half, three_quarters)
    entry = cache_entry_dir(ROOT, *cache_key(*three_quarters))
    assert entry.name.startswith("wanda-unstructured75-")
    assert ppl_cache_key(weights_key(*half), EVAL_BASE) != ppl_cache_key(weights_key(*three_quarters), EVAL_BASE)
    # the same pattern under other names is one entry: sparsity=unstructured (ratio 0.5) and nm2_4 with its ratio
    renamed = SparsityConfig(name="unstructured0.5", kind="unstructured", ratio=0.5)
    assert _hits(half, Setting(TINY, wanda, renamed, CAL))
    assert _hits(Setting(TINY, wanda, NM24, CAL), Setting(TINY, wanda, replace(NM24, name="nm", ratio=0.5), CAL))
    assert cache_entry_dir(ROOT, *cache_key(*half)).name.startswith("wanda-unstructured50-")


def test_target_order_does_not_matter() -> None:
    dsnot = PRUNERS["dsnot"]
    swapped = replace(dsnot, targets=dsnot.targets[::-1], refine_targets=dsnot.refine_targets[::-1])
    assert _hits(Setting(TINY, dsnot, U50, CAL), Setting(TINY, swapped, U50, CAL))


def _two_gguf_files_in_one_folder(tmp_path: Path) -> tuple[ModelConfig, ModelConfig]:
    """``model.path=<folder> model.gguf_file=…`` for two GGUF files of other weights side by side (a folder holding
    a model's Q8_0 and F16 files): only ``gguf_file`` tells them apart, so it must reach the identity (the model
    identity reads the bytes only; they need not be a loadable GGUF)."""
    folder = tmp_path / "gguf"
    folder.mkdir(exist_ok=True)
    (folder / "model-q8_0.gguf").write_bytes(b"GGUF" + bytes(range(200)))
    (folder / "model-f16.gguf").write_bytes(b"GGUF" + bytes(range(200, 0, -1)))
    model = ModelConfig(name="gguf", path=str(folder))
    return replace(model, gguf_file="model-q8_0.gguf"), replace(model, gguf_file="model-f16.gguf")


@pytest.mark.parametrize("pruner", list(PRUNERS))
def test_calibration_file_content_model_identity_and_code_version_change_the_key(pruner, tmp_path, monkeypatch):
    base = Setting(TINY, PRUNERS[pruner], NM24, CAL)
    copy = tmp_path / "data"
    shutil.copytree(SAMPLE_DATA_DIR / "c4", copy / "c4")
    assert _hits(base, base._replace(data_dir=str(copy)))  # the same bytes elsewhere
    sample = copy / "c4" / "c4_sample.jsonl"
    lines = sample.read_text().splitlines()
    sample.write_text("\n".join([json.dumps({"text": "changed"}), *lines[1:]]) + "\n")
    assert _hits(base, base._replace(data_dir=str(copy))) == (pruner not in CALIBRATED)
    assert not _hits(base, base._replace(model=replace(TINY, seed=1)))
    assert not _hits(base, base._replace(model=replace(TINY, torch_dtype="bfloat16")))
    assert not _hits(base, base._replace(model=replace(TINY, arch={"num_hidden_layers": 3})))
    q8, f16 = _two_gguf_files_in_one_folder(tmp_path)
    assert not _hits(base._replace(model=q8), base._replace(model=f16))
    key_before = cache_key(*base)[1]
    monkeypatch.setattr(pruning_cache, "PRUNING_CODE_VERSION", "changed")
    assert cache_key(*base)[1] != key_before


def test_dense_weights_key_is_the_model_identity_whatever_the_pruner(tmp_path: Path) -> None:
    dense = weights_key(TINY)
    assert weights_key(TINY, PrunerConfig(name="none", targets=["q_proj"]), U50, CAL) == dense
    assert weights_key(TINY, PRUNERS["wanda"], SparsityConfig(), CAL) == dense
    assert weights_key(replace(TINY, seed=1)) != dense
    assert weights_key(replace(TINY, torch_dtype="bfloat16")) != dense
    assert weights_key(replace(TINY, arch={"num_hidden_layers": 3})) != dense
    q8, f16 = _two_gguf_files_in_one_folder(tmp_path)
    assert weights_key(q8) != weights_key(f16)


@pytest.mark.parametrize("field", list(EVAL_CASES))
def test_eval_field_changes_the_perplexity_key_exactly_when_it_reaches_the_measurement(field: str) -> None:
    value, changes = EVAL_CASES[field]
    other = replace(EVAL_BASE, **{field: value})
    same_key = ppl_cache_key("w", EVAL_BASE, SAMPLE_DATA_DIR) == ppl_cache_key("w", other, SAMPLE_DATA_DIR)
    assert same_key != changes
    # what perplexity() is called with (cached_perplexity passes exactly ppl_settings) changes with the key
    assert (ppl_settings(EVAL_BASE) != ppl_settings(other)) == changes


def test_perplexity_key_follows_the_weights_the_data_bytes_and_the_version(tmp_path, monkeypatch) -> None:
    key = ppl_cache_key("w", EVAL_BASE, SAMPLE_DATA_DIR)
    assert ppl_cache_key("w2", EVAL_BASE, SAMPLE_DATA_DIR) != key
    copy = tmp_path / "data"
    shutil.copytree(SAMPLE_DATA_DIR / "wikitext2", copy / "wikitext2")
    assert ppl_cache_key("w", EVAL_BASE, copy) == key
    test_file = copy / "wikitext2" / "test.json"
    test_file.write_text(test_file.read_text().replace("the", "a", 1))
    assert ppl_cache_key("w", EVAL_BASE, copy) != key
    monkeypatch.setattr(ppl_cache, "PPL_CACHE_VERSION", "changed")
    assert ppl_cache_key("w", EVAL_BASE, SAMPLE_DATA_DIR) != key


@cache
def _pruned(pruner: str, field: str = "", value: Any = None, batch_size: int = CAL.batch_size
            ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Masks and weights of the tiny model pruned (2:4) with ``PRUNERS[pruner]``, ``field`` set to ``value``."""
    config = PRUNERS[pruner]
    if field:
        config = replace(config, **{field: list(value) if isinstance(value, tuple) else value})
    model = tiny_llama(seed=0)
    calibration = replace(CAL, batch_size=batch_size)
    result = prune_model(model, tiny_tokenizer(), config, NM24, calibration, str(SAMPLE_DATA_DIR), "cpu")
    return result.masks, {k: v.clone() for k, v in model.state_dict().items()}


HIT_FIELDS = [(p, f) for p in PRUNERS for f in PRUNER_AFFECTS if p not in PRUNER_AFFECTS[f]]


@pytest.mark.parametrize(("pruner", "field"), HIT_FIELDS)
def test_a_field_classified_as_not_changing_the_result_does_not_change_it(pruner: str, field: str) -> None:
    """Guards the table itself: if a pruner starts using a field, this fails and the key must take the field."""
    value = _other_pruner_value(PRUNERS[pruner], field)
    masks, weights = _pruned(pruner)
    other_masks, other_weights = _pruned(pruner, field, tuple(value) if isinstance(value, list) else value)
    assert all(torch.equal(masks[k], other_masks[k]) for k in masks)
    assert all(torch.equal(weights[k], other_weights[k]) for k in weights)


@pytest.mark.parametrize("pruner", CALIBRATED)
def test_calibration_batch_size_changes_only_the_rounding(pruner: str) -> None:
    masks, weights = _pruned(pruner)
    other_masks, other_weights = _pruned(pruner, batch_size=1)
    assert all(torch.equal(masks[k], other_masks[k]) for k in masks)
    for k in weights:
        torch.testing.assert_close(other_weights[k], weights[k], rtol=0, atol=1e-4)
