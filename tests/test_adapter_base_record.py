"""Adapter folders record the base they were trained on, and every loading path refuses another base.

One tiny ``train.py`` run (``adapter=lora``, LoRA*) writes ``<run>/adapter``; its record is checked against
independent computations (the model identity, the pruning cache key, the zero pattern of the same base pruned again
through the cache), then loaded by ``eval.py adapter_dir=`` (preflight and after loading),
``load_adapter_dir`` and ``PeftModel.from_pretrained`` on the right base (accepted, same logits as the run's export)
and on other bases (refused in one line). LoRA* folders are not plain LoRA for peft; damaged files are one line.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from peft import PeftModel
from test_eval_job import _compose
from train_helpers import tiny_job
from transformers import AutoModelForCausalLM

import spp.peft  # noqa: F401  (registers SPP / SPARSE_LORA / LORA_STAR with peft)
from spp.adapters.methods.spp.config import SPPAdapterConfig as PaperSPPConfig
from spp.adapters.methods.spp.model import inject
from spp.adapters.registry import MARKER, describe_dir, get_method, load_adapter_dir, save_adapter_dir, trained_on
from spp.adapters.trained_on import RECORD, model_fingerprint, zero_fingerprint
from spp.errors import UserError
from spp.eval.runner import run_eval_job
from spp.models.loading import model_identity
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.peft import LoraStarConfig, from_lora_star_adapter
from spp.pruning import prune_model
from spp.pruning.cache import cache_key
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.phase import get_or_reconstruct

IDS = torch.randint(0, 260, (2, 12), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A tiny LoRA* run (2 steps): its job, adapter folder and merged export."""
    from train import run_job

    tmp = tmp_path_factory.mktemp("lora_run")
    job = tiny_job(tmp, "adapter=lora", "trainer.max_steps=2", "dense_ppl=false", "pruned_ppl=false")
    summary = run_job(job)
    assert summary["status"] == "ok"
    return job, tmp / "run" / "adapter", tmp / "run" / "merged"


def same_base(job) -> torch.nn.Module:
    """The run's pruned base, built again (the pruning cache's entry applied to a fresh model)."""
    model = tiny_llama(seed=0)
    get_or_reconstruct(model, tiny_tokenizer(), job.model, job.pruner, job.sparsity, job.calibration,
                       ReconstructConfig(), job.cache_dir, data_dir=job.data_dir, device="cpu")
    return model


def magnitude_base() -> torch.nn.Module:
    """The same model pruned otherwise (magnitude 2:4): another zero pattern."""
    model = tiny_llama(seed=0)
    prune_model(model, None, PrunerConfig(name="magnitude"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                device="cpu")
    return model


def pruned_zeros(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p == 0 for n, p in model.named_parameters() if n.endswith("_proj.weight")}


def test_train_run_records_its_base(lora_run):
    job, adapter, _ = lora_run
    record = json.loads((adapter / MARKER).read_text())[RECORD]
    assert record["model"] == {"name": "tiny", "identity": model_identity(job.model), "dtype": "float32"}
    key, digest = cache_key(job.model, job.pruner, job.sparsity, job.calibration, job.data_dir)
    assert record["pruning"]["cache_key"] == digest and record["pruning"]["key"] == json.loads(json.dumps(key))
    base = same_base(job)
    masks = record["masks"]
    assert masks["sha256"] == model_fingerprint(base)["sha256"]
    assert (masks["layers"], masks["zeros"], masks["total"]) == (14, 36864, 73728)  # 2:4 on 14 projections
    # negative control: one flipped bit gives another fingerprint
    zeros = {n.removesuffix(".weight"): z for n, z in pruned_zeros(base).items()}
    zeros["model.layers.0.mlp.up_proj"][0, 0] ^= True
    assert zero_fingerprint(zeros)["sha256"] != masks["sha256"]
    assert model_fingerprint(magnitude_base())["sha256"] != masks["sha256"]


@pytest.fixture()
def no_model_loading(monkeypatch):
    def _fail(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was reported")

    monkeypatch.setattr("spp.eval.runner.load_model", _fail)


def _eval(job, adapter, *overrides):
    return _compose(f"adapter_dir={adapter}", f"cache_dir={job.cache_dir}", *overrides)


@pytest.mark.usefixtures("no_model_loading")
def test_eval_refuses_another_model_or_pruning_before_loading(lora_run, tmp_path):
    job, adapter, _ = lora_run
    with pytest.raises(UserError, match=r"was trained on tiny \(tiny-[0-9a-f]+, float32\) pruned wanda nm2_4, not on "
                                        r"this base: model=tiny \(.*\) when trained, tiny_qwen2 \(.*\) here; pruned "
                                        r"wanda nm2_4 when trained, dense here") as err:
        run_eval_job(_eval(job, adapter, "model=tiny_qwen2"), tmp_path)
    assert "model=tiny pruner=wanda sparsity=nm2_4" in err.value.fix and "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"calibration.nsamples=4 when trained, 8 here"):
        run_eval_job(_eval(job, adapter, "pruner=wanda", "sparsity=nm2_4", "calibration=c4",
                           "calibration.nsamples=8", "calibration.seqlen=128"), tmp_path)
    with pytest.raises(UserError, match=r"calibration.nsamples=4 when trained, 32 here; calibration.seqlen=128 when "
                                        r"trained, 512 here —") as err:  # eval.py's default calibration (its sampling
        # is c4's default, document, as the run's null: the same draw, not named as a difference)
        run_eval_job(_eval(job, adapter, "pruner=wanda", "sparsity=nm2_4"), tmp_path)
    assert ("calibration=c4 calibration.nsamples=4 calibration.seqlen=128 calibration.seed=0 "
            "calibration.sampling=document") in err.value.fix
    with pytest.raises(UserError, match=r"pruner.name='wanda' when trained, 'magnitude' here"):
        run_eval_job(_eval(job, adapter, "pruner=magnitude", "sparsity=nm2_4"), tmp_path)


def test_eval_on_the_recorded_base_gives_the_exports_perplexity(lora_run, tmp_path):
    job, adapter, merged = lora_run
    overrides = ["pruner=wanda", "sparsity=nm2_4", "calibration=c4", "calibration.nsamples=4",
                 "calibration.seqlen=128", "eval.seqlen=64", "eval.max_windows=2"]
    adapted = run_eval_job(_eval(job, adapter, *overrides), tmp_path / "adapted")
    exported = run_eval_job(_compose(f"model.path={merged}", "eval.seqlen=64", "eval.max_windows=2"), tmp_path / "m")
    assert adapted.ppl["wikitext2"]["ppl"] == pytest.approx(exported.ppl["wikitext2"]["ppl"], rel=1e-5)


def test_load_adapter_dir_checks_the_zero_pattern_and_warns_without_record(lora_run, tmp_path, caplog):
    job, adapter, _ = lora_run
    with pytest.raises(UserError, match=r"the zero pattern differs \(36,864 zeros of 73,728 weights in 14 layers when "
                                        r"trained, 36,864 of 73,728 in 14 here\)"):
        load_adapter_dir(magnitude_base(), adapter, {})
    with pytest.raises(UserError, match=r"the zero pattern differs \(36,864 zeros .* 0 of 73,728 in 14 here\)"):
        load_adapter_dir(tiny_llama(seed=0), adapter, {})  # the dense model
    merged, info = load_adapter_dir(same_base(job), adapter, {})
    assert info["method"] == "lora"
    # a folder written before the record: loaded, with one warning line
    old = tmp_path / "old"
    shutil.copytree(adapter, old)
    marker = json.loads((old / MARKER).read_text())
    del marker[RECORD]
    (old / MARKER).write_text(json.dumps(marker))
    assert trained_on(old) is None
    with caplog.at_level(logging.WARNING, logger="spp.adapters.trained_on"):
        load_adapter_dir(magnitude_base(), old, {})
    assert any("records no base it was trained on" in r.getMessage() for r in caplog.records)


def test_peft_loads_lora_star_re_masked_and_refuses_another_base(lora_run):
    job, adapter, merged_dir = lora_run
    assert json.loads((adapter / "adapter_config.json").read_text())["peft_type"] == "LORA_STAR"
    base = same_base(job)
    zeros = pruned_zeros(base)
    loaded = PeftModel.from_pretrained(base, str(adapter))
    assert isinstance(loaded.peft_config["default"], LoraStarConfig)
    merged = loaded.merge_and_unload()
    for name, zero in zeros.items():
        assert torch.equal(merged.get_parameter(name)[zero], torch.zeros(int(zero.sum()))), name
    export = AutoModelForCausalLM.from_pretrained(merged_dir)
    with torch.no_grad():
        torch.testing.assert_close(merged.eval()(IDS).logits, export.eval()(IDS).logits, rtol=0, atol=1e-5)
    with pytest.raises(UserError, match="was trained on tiny .* not on this base: the zero pattern differs"):
        PeftModel.from_pretrained(magnitude_base(), str(adapter))


def test_old_lora_star_folder_loads_re_masked(lora_run, tmp_path):
    job, adapter, _ = lora_run
    old = tmp_path / "old"
    shutil.copytree(adapter, old)
    config = json.loads((old / "adapter_config.json").read_text())
    (old / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "LORA"}))
    base = same_base(job)
    zeros = pruned_zeros(base)
    merged = from_lora_star_adapter(base, old).merge_and_unload()
    assert all(not merged.get_parameter(n)[z].any() for n, z in zeros.items())
    own, _ = load_adapter_dir(same_base(job), old, {})  # spp's own path reads the old type too
    with torch.no_grad():
        torch.testing.assert_close(merged.eval()(IDS).logits, own.eval()(IDS).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ["spp", "sparse_lora"])
def test_peft_refuses_spp_and_sparse_lora_folders_on_another_base(lora_run, tmp_path, method, caplog):
    """The record written by ``save_adapter_dir`` (here the LoRA* run's, the same base) reaches peft's tuners."""
    job, adapter, _ = lora_run
    record = trained_on(adapter)
    base = same_base(job)
    if method == "spp":
        model, cfg = inject(base, r=8), PaperSPPConfig(r=8)
    else:
        from spp.adapters.methods.sparse_lora.config import SparseLoRAConfig
        from spp.adapters.methods.sparse_lora.layer import inject_sparse_lora

        model, cfg = inject_sparse_lora(base), SparseLoRAConfig()
    save_adapter_dir(get_method(method), model, tmp_path / method, {RECORD: record, "pruning": {}}, cfg)
    assert trained_on(tmp_path / method) == record
    assert PeftModel.from_pretrained(same_base(job), str(tmp_path / method)) is not None
    with pytest.raises(UserError, match="not on this base: the zero pattern differs"):
        PeftModel.from_pretrained(magnitude_base(), str(tmp_path / method))
    with pytest.raises(UserError, match="the zero pattern differs"):
        load_adapter_dir(magnitude_base(), tmp_path / method, {})
    # a folder written before the record: peft loads it, with one warning line
    save_adapter_dir(get_method(method), model, tmp_path / "old", {"pruning": {}}, cfg)
    with caplog.at_level(logging.WARNING, logger="spp.adapters.trained_on"):
        PeftModel.from_pretrained(magnitude_base(), str(tmp_path / "old"))
    assert any("records no base it was trained on" in r.getMessage() for r in caplog.records)


@pytest.mark.usefixtures("no_model_loading")
def test_damaged_files_are_one_line_naming_the_file(lora_run, tmp_path):
    job, adapter, _ = lora_run
    bad = tmp_path / "bad"
    shutil.copytree(adapter, bad)
    text = (bad / MARKER).read_text()
    (bad / MARKER).write_text(text[: len(text) // 2])
    with pytest.raises(UserError, match=rf"{bad / MARKER} is damaged \(not valid JSON") as err:
        run_eval_job(_eval(job, bad), tmp_path / "out")
    assert "copy the adapter folder again" in err.value.fix
    (bad / MARKER).write_text(text)
    weights = bad / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(UserError, match=rf"{weights} is damaged \(.*incomplete metadata"):
        describe_dir(bad)
    with pytest.raises(UserError, match=rf"{weights} is damaged"):
        PeftModel.from_pretrained(tiny_llama(seed=0), str(bad))


def test_spp_load_adapter_names_a_truncated_file(tmp_path):
    from spp import load_adapter, save_adapter

    save_adapter(inject(tiny_llama(seed=0), r=8), tmp_path)
    weights = tmp_path / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(UserError, match=rf"{weights} is damaged"):
        load_adapter(tiny_llama(seed=0), tmp_path)



def test_eval_of_a_saved_pruned_folder_checks_its_zero_pattern(lora_run, tmp_path):
    """``model.path=<folder>`` without ``pruner=`` (e.g. prune.py's ``<run>/model``): no settings to compare before
    loading; the folder's zero pattern decides (the run's base accepted, another pruning refused)."""
    job, adapter, merged = lora_run
    scores = {}
    for name, model in (("same", same_base(job)), ("magnitude", magnitude_base())):
        model.save_pretrained(tmp_path / name)
        tiny_tokenizer().save_pretrained(tmp_path / name)
        cfg = _compose(f"model.path={tmp_path / name}", f"adapter_dir={adapter}", "eval.max_windows=2")
        if name == "magnitude":
            with pytest.raises(UserError, match="not on this base: the zero pattern differs"):
                run_eval_job(cfg, tmp_path / f"out-{name}")
        else:
            scores[name] = run_eval_job(cfg, tmp_path / f"out-{name}").ppl["wikitext2"]["ppl"]
    exported = run_eval_job(_compose(f"model.path={merged}", "eval.max_windows=2"), tmp_path / "m")
    assert scores["same"] == pytest.approx(exported.ppl["wikitext2"]["ppl"], rel=1e-5)
