"""Every field of the pruning and perplexity cache keys, changed in turn: what changes the result must miss, what
does not must hit (same digest and same entry directory).

The pruner's part of the key is derived from its own config dataclass (``spp.pruning.cache.pruner_key``): every
field of every registered pruner's config (``spp.pruning.registry``) is changed in turn and must miss, unless its
metadata leaves it out of the key (``cache_key``: ``False`` or a predicate, with a ``reason``): then it must hit,
and pruning a real tiny model with the other value must give the same masks and weights. A field of a new type
fails ``test_every_pruner_field_has_another_value`` until :func:`_other_value` can change it. The fields of
``SparsityConfig``, ``CalibrationConfig`` and ``EvalConfig`` are classified by hand below.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import replace
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
import torch

import spp.eval.ppl_cache as ppl_cache
import spp.pruning.cache as pruning_cache
from spp.eval.config import EvalConfig
from spp.eval.ppl_cache import ppl_cache_key, ppl_settings
from spp.models.config import ModelConfig
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.paths import SAMPLE_DATA_DIR
from spp.pruning.cache import cache_entry_dir, cache_key, pruner_key
from spp.pruning.config import CACHE_KEY, CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model
from spp.pruning.pruners.dsnot import INITIAL_METHODS
from spp.pruning.pruners.ria.pruner import SCOPES
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.registry import PRUNERS as REGISTERED_PRUNERS
from spp.pruning.registry import needs_calibration, pruner_config
from spp.training.run import pruning_identity

TINY = ModelConfig(name="tiny", path="tiny")
U50 = SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5)
NM24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
CAL = CalibrationConfig(source="c4", nsamples=4, seqlen=32, seed=0, batch_size=2)
ROOT = Path("/cache-root")

PRUNERS: dict[str, PrunerConfig] = {
    **{name: pruner_config(name) for name in REGISTERED_PRUNERS.names()},  # every registered pruner at its defaults
    "dsnot": pruner_config("dsnot", max_cycles=5),
    "dsnot_sparsegpt": pruner_config("dsnot", initial_method="sparsegpt", max_cycles=5),  # percdamp in the key
}
CALIBRATED = tuple(p for p, cfg in PRUNERS.items() if needs_calibration(cfg))

CHOICES: dict[str, tuple[str, ...]] = {"initial_method": INITIAL_METHODS, "scope": SCOPES}
"""String fields with a fixed set of values: another value is the next one."""


def _other_value(base: PrunerConfig, name: str) -> Any:
    """A valid value of ``base``'s field ``name`` other than its own (by type; choices from :data:`CHOICES`)."""
    value = getattr(base, name)
    if name in CHOICES:
        return next(v for v in CHOICES[name] if v != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value else 1
    if isinstance(value, float):
        return value * 2 + 0.01
    if isinstance(value, list):
        return value[:1] if len(value) > 1 else ["q_proj", "up_proj"]
    raise AssertionError(f"{type(base).__name__}.{name}: teach _other_value another value of {value!r}")


def _in_key(cfg: PrunerConfig, name: str) -> bool:
    """What the field's metadata says: the field is in ``cfg``'s cache key."""
    rule = next(f for f in dataclasses.fields(cfg) if f.name == name).metadata.get(CACHE_KEY, True)
    return rule(cfg) if callable(rule) else bool(rule)


FIELD_CASES = [(p, f.name) for p, cfg in PRUNERS.items() for f in dataclasses.fields(cfg) if f.name != "name"]
HIT_FIELDS = [(p, f) for p, f in FIELD_CASES if not _in_key(PRUNERS[p], f)]


# SparsityConfig field -> (base, the same with only that field changed, changes the result).
SPARSITY_CASES: dict[str, tuple[SparsityConfig, SparsityConfig, bool]] = {
    "name": (U50, replace(U50, name="half"), False),
    "kind": (SparsityConfig(name="p", kind="nm", ratio=0.5, n=2, m=4),
             SparsityConfig(name="p", kind="unstructured", ratio=0.5, n=2, m=4), True),
    "ratio": (U50, replace(U50, ratio=0.75), True),  # sparsity=unstructured50 sparsity.ratio=0.75
    "n": (NM24, replace(NM24, n=1), True),
    "m": (NM24, replace(NM24, m=8), True),
    "layerwise": (U50, replace(U50, layerwise="owl"), True),
    "owl_lambda": (replace(U50, layerwise="owl"), replace(U50, layerwise="owl", owl_lambda=0.1), True),
    "owl_m": (replace(U50, layerwise="owl"), replace(U50, layerwise="owl", owl_m=7.0), True),
    "rmi_delta": (replace(U50, layerwise="rmi"), replace(U50, layerwise="rmi", rmi_delta=0.02), True),
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
    "log_samples": (True, False),  # lm-eval's per-document records written beside the results (the recovery study)
}


def weights_key(model: ModelConfig, pruner: PrunerConfig | None = None, sparsity: SparsityConfig | None = None,
                calibration: CalibrationConfig | None = None, data_dir: str | None = None) -> str:
    """What the perplexity cache keys the measured weights on: the job's ``pruning_identity(...).pruned_weights``
    (the model identity when dense, else the pruning cache key's digest)."""
    job = SimpleNamespace(model=model, pruner=pruner or PrunerConfig(), sparsity=sparsity or SparsityConfig(),
                          calibration=calibration or CalibrationConfig(), data_dir=data_dir,
                          reconstruct=ReconstructConfig())
    return pruning_identity(job).pruned_weights


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
    names = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (SparsityConfig, CalibrationConfig, EvalConfig)}
    assert names[SparsityConfig] == set(SPARSITY_CASES), "classify the new SparsityConfig field in SPARSITY_CASES"
    assert names[CalibrationConfig] == set(CALIBRATION_CASES), "classify the new field in CALIBRATION_CASES"
    assert names[EvalConfig] == set(EVAL_CASES), "classify the new EvalConfig field in EVAL_CASES"


@pytest.mark.parametrize(("pruner", "field"), FIELD_CASES)
def test_every_pruner_field_has_another_value(pruner: str, field: str) -> None:
    base = PRUNERS[pruner]
    assert _other_value(base, field) != getattr(base, field)
    replace(base, **{field: _other_value(base, field)})  # valid


@pytest.mark.parametrize(("pruner", "field"), FIELD_CASES)
def test_a_pruner_field_misses_unless_its_metadata_leaves_it_out(pruner: str, field: str) -> None:
    base = PRUNERS[pruner]
    other = replace(base, **{field: _other_value(base, field)})
    assert _hits(Setting(TINY, base, U50, CAL), Setting(TINY, other, U50, CAL)) == (not _in_key(base, field))


def test_every_pruner_has_its_own_key_and_the_base_config_means_the_defaults() -> None:
    digests = {cache_key(TINY, cfg, U50, CAL, str(SAMPLE_DATA_DIR))[1] for cfg in PRUNERS.values()}
    assert len(digests) == len(PRUNERS)
    for name in REGISTERED_PRUNERS.names():  # PrunerConfig(name="wanda"), as code writes it, is pruner=wanda's defaults
        assert _hits(Setting(TINY, PrunerConfig(name=name), U50, CAL), Setting(TINY, pruner_config(name), U50, CAL))


def test_the_keys_of_existing_settings_did_not_change() -> None:
    """The keys the hand-written list gave before the pruners became plug-ins (PRUNING_CODE_VERSION "1"): entries
    written before still hit."""
    targets = sorted(PrunerConfig().targets)
    dsnot = {"name": "dsnot", "targets": targets, "true_sequential": False, "initial_method": "wanda",
             "max_cycles": 50, "update_threshold": 0.1, "pow_of_var_regrowing": 1.0, "same_sign_check": False,
             "refine_targets": ["k_proj", "o_proj", "q_proj", "v_proj"]}
    assert pruning_cache.PRUNING_CODE_VERSION == "2"  # "2": SparseGPT's exact Hessian sum (the other fields kept)
    assert pruner_key(pruner_config("magnitude", true_sequential=True)) == {"name": "magnitude", "targets": targets}
    assert pruner_key(pruner_config("wanda")) == {"name": "wanda", "targets": targets, "true_sequential": False}
    assert pruner_key(pruner_config("sparsegpt", blocksize=64)) == {
        "name": "sparsegpt", "targets": targets, "true_sequential": False, "blocksize": 64, "percdamp": 0.01}
    assert pruner_key(pruner_config("dsnot", percdamp=0.5)) == dsnot
    assert pruner_key(pruner_config("dsnot", initial_method="sparsegpt")) == {
        **dsnot, "initial_method": "sparsegpt", "percdamp": 0.01}


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
    dsnot = PRUNERS["dsnot"]  # fields marked unordered
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
    # what perplexity() is called with (cached_offloaded_perplexity passes exactly ppl_settings) changes with the key
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


@pytest.mark.parametrize(("pruner", "field"), HIT_FIELDS)
def test_a_field_classified_as_not_changing_the_result_does_not_change_it(pruner: str, field: str) -> None:
    """Guards the metadata: if a pruner starts using a field left out of its key, this fails."""
    value = _other_value(PRUNERS[pruner], field)
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


@pytest.mark.parametrize("form_options", [{}, {"r": 4}])
def test_a_jobs_run_and_the_reconstruction_probe_compute_the_same_keys(tmp_path, form_options):
    """``pruning_identity`` (a job's ``Run``, with the resolved form) and ``probe`` without keys (``prune.py``,
    ``eval.py``, with or without the resolved form) compute the pruning and reconstruction keys in one place: the
    same digests and the same entry, for a form at its defaults (``lr`` null: the form's own rate) and with options;
    negative control: another ``reconstruct.lr`` is another reconstruction key (the pruning key unchanged)."""
    from spp.distributed import DistContext
    from spp.pruning.reconstruction.phase import probe
    from spp.pruning.resolve import resolve_form

    recon = ReconstructConfig(name="blockwise", form="spp", nsamples=4, seqlen=32, form_options=form_options)
    job = SimpleNamespace(model=TINY, pruner=PRUNERS["sparsegpt"], sparsity=NM24, calibration=CAL,
                          data_dir=str(SAMPLE_DATA_DIR), reconstruct=recon)
    identity = pruning_identity(job, resolve_form(recon))
    for form in (resolve_form(recon), None):
        found = probe(recon, TINY, job.pruner, NM24, CAL, str(tmp_path), job.data_dir, DistContext(), form=form)
        assert (found.key, found.digest) == identity.reconstruction
        assert found.entry == cache_entry_dir(tmp_path, identity.key, identity.reconstruction[1], form="blockwise")
    other = pruning_identity(SimpleNamespace(**{**vars(job), "reconstruct": replace(recon, lr=1e-2)}))
    assert other.digest == identity.digest and other.reconstruction[1] != identity.reconstruction[1]
