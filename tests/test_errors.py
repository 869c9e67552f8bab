"""Every bad input answered in one line before any weight is loaded; runs that go wrong stop and export
nothing as if fine; what worked keeps working (docs/errors.md).

The command-line cases call each command's ``main`` in process (Hydra parses the patched ``sys.argv``), with every
weight loader replaced by one that fails the test: a preflight case that reached a weight would show a traceback.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from train_helpers import tiny_job

from spp.atomic import remove_stale_temporaries
from spp.distributed import DistContext
from spp.errors import DivergedError, UserError, as_user_error, user_errors
from spp.eval.config import EvalConfig
from spp.eval.offloaded import cached_offloaded_perplexity
from spp.models.config import ModelConfig
from spp.models.offload import OffloadedModel
from spp.models.tiny import tiny_llama
from spp.paths import CONF_DIR, SAMPLE_DATA_DIR, data_provenance, find_data, forget_data_reads
from spp.preflight.data_files import check_data_source
from spp.pruning.cache import store
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.phase import get_or_reconstruct
from spp.training import finalize as finalize_module
from spp.training.callbacks.guards import GuardsCallback
from spp.training.finalize import divergence
from spp.training.resume_checks import settings_of
from train import run_job

FAST = 20.0
"""Seconds a preflight error may take in process (no model load, no pruning; generous for a loaded machine)."""


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if any command loads a model's weights."""

    def refuse(*_a, **_k):
        raise AssertionError("model weights were loaded before the error")

    for target in ("spp.training.finalize.load_skeleton", "spp.pruning.job.load_model", "spp.eval.runner.load_model",
                   "spp.models.loading.AutoModelForCausalLM.from_pretrained", "spp.models.loading.tiny_llama"):
        module, _, name = target.rpartition(".")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError:
            obj_module, _, obj = module.rpartition(".")
            mod = getattr(importlib.import_module(obj_module), obj)
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, refuse)


def cli(cmd: str, args: list[str], tmp_path: Path, monkeypatch, capsys) -> tuple[int, str, float]:
    """Run ``<cmd>.py args`` in process; returns (exit code, stderr, seconds)."""
    module = importlib.import_module(cmd)
    common = [f"hydra.run.dir={tmp_path / 'hydra'}", "hydra.output_subdir=null"]
    if cmd == "train":
        common += [f"run_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}", "print_config=false"]
    elif cmd in ("prune", "eval"):
        common += [f"run_dir={tmp_path / 'out'}", f"cache_dir={tmp_path / 'cache'}"]
    monkeypatch.setattr(sys, "argv", [f"{cmd}.py", f"--config-path={CONF_DIR}", *args, *common])
    capsys.readouterr()
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        module.main()
    return exc.value.code, capsys.readouterr().err, time.perf_counter() - start


def one_line(err: str, cmd: str, *names: str) -> str:
    """The single ``<cmd>: error: <what> — <fix>`` line of ``err``, naming every one of ``names``."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"{cmd}.py: error: ") and " — " in line, line
    assert "Traceback" not in err
    for name in names:
        assert name in line, (name, line)
    return line


def assert_nothing_complete(tmp_path: Path) -> None:
    """No file a later run could take for a complete result: no summary, merged model, adapter or cache entry."""
    for pattern in ("**/summary.json", "**/merged", "**/adapter", "**/manifest.json", "**/results.json"):
        assert not list(tmp_path.glob(pattern)), pattern


def refused_fast(args: list[str], key: str, tmp_path: Path, monkeypatch, capsys) -> None:
    """``train.py <args>`` exits 2 with one line naming ``key``, within ``FAST`` seconds, leaving nothing complete."""
    code, err, seconds = cli("train", args, tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "train", key)
    assert seconds < FAST
    assert_nothing_complete(tmp_path)


TINY = ["model=tiny", "debug=fast", f"data_dir={SAMPLE_DATA_DIR}"]


# ------------------------------------------------------------------ config values: one line instead of a traceback
@pytest.mark.parametrize("args, key", [
    (["adapter.r=0"], "adapter.r"),
    (["sparsity=unstructured50", "sparsity.ratio=1.5"], "sparsity.ratio"),
    (["calibration.nsamples=0"], "calibration.nsamples"),
    (["data.max_length=0"], "data.max_length"),
    (["adapter.scale=nan"], "adapter.scale"),
    (["adapter.scale=-1"], "adapter.scale"),
    (["trainer.lr=nan"], "trainer.lr"),
    (["guards.max_ppl_ratio=0.5"], "guards.max_ppl_ratio"),
    (["sample.max_new_tokens=0"], "sample.max_new_tokens"),
])
def test_config_value_errors_are_one_line(args, key, tmp_path, monkeypatch, capsys, no_weights):
    refused_fast(args=[*TINY, *args], key=key, tmp_path=tmp_path, monkeypatch=monkeypatch, capsys=capsys)


def test_prune_py_config_error_is_one_line(tmp_path, monkeypatch, capsys, no_weights):
    code, err, _ = cli("prune", ["model=tiny", "calibration.nsamples=0"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "prune", "calibration.nsamples")


def test_a_config_user_error_is_printed_once_not_wrapped_again(tmp_path, monkeypatch, capsys, no_weights):
    """``ReconstructConfig`` raises a UserError of its own while the job is built: its line keeps its one fix (it was
    wrapped again, ``... — set it >= 1 — change reconstruct.nsamples (see docs/errors.md)``)."""
    code, err, _ = cli("prune", ["model=tiny", "reconstruct=blockwise", "reconstruct.nsamples=0"], tmp_path,
                       monkeypatch, capsys)
    line = one_line(err, "prune", "reconstruct.nsamples")
    assert code == 2 and line.endswith("reconstruct.nsamples=0 is not valid — set it >= 1"), line
    assert line.count(" — ") == 1 and "docs/errors.md" not in line, line


def test_user_errors_wraps_a_value_error_once_and_passes_a_user_error() -> None:
    own = UserError("model.path='x' holds nothing", "point model.path= at a model; now 'x'", key="model.path")
    with pytest.raises(UserError) as caught, user_errors(ValueError, FileNotFoundError):
        raise own
    assert caught.value is own  # not wrapped (the wrapper split its fix at '; ' and lost key and path)
    with pytest.raises(UserError) as caught, user_errors(ValueError, prefix="sparse24=true: "):
        raise ValueError("layer x is not 2:4; prune it with sparsity=nm2_4")
    assert str(caught.value) == "sparse24=true: layer x is not 2:4 — prune it with sparsity=nm2_4"
    with pytest.raises(KeyError), user_errors(ValueError):  # negative control: other kinds pass untouched
        raise KeyError("x")


# ------------------------------------------------------------------ unknown keys, also with +
def test_unknown_key_added_with_plus_is_rejected(tmp_path, monkeypatch, capsys, no_weights):
    code, err, _ = cli("train", [*TINY, "+adapter.rr=16"], tmp_path, monkeypatch, capsys)
    assert code == 2
    line = one_line(err, "train", "adapter.rr")
    assert "adapter.r=" in line  # the suggestion


def test_unknown_key_without_plus_gets_the_same_line(tmp_path, monkeypatch, capsys, no_weights):
    """Not Hydra's exit 1 advising ``+adapter.rr=16`` (spp.overrides checks sys.argv first)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    code, err, _ = cli("train", [*TINY, "adapter.rr=16"], tmp_path, monkeypatch, capsys)
    assert code == 2
    line = one_line(err, "train", "adapter.rr", "did you mean adapter.r=?")
    assert "+adapter.rr" not in line


@pytest.mark.parametrize("cmd", ["prune", "eval"])
def test_plus_unknown_key_in_prune_and_eval(cmd, tmp_path, monkeypatch, capsys, no_weights):
    code, err, _ = cli(cmd, ["model=tiny", "+calibration.nsampels=3"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, cmd, "calibration.nsampels")


# ------------------------------------------------------------------ model files
def test_missing_model_path(tmp_path, monkeypatch, capsys, no_weights):
    code, err, _ = cli("train", ["model.path=/nonexistent"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "train", "model.path", "/nonexistent")


def test_text_file_named_gguf(tmp_path, monkeypatch, capsys, no_weights):
    fake = tmp_path / "model.gguf"
    fake.write_text("not a model\n")
    code, err, seconds = cli("train", [f"model.path={fake}"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "train", "model.path", str(fake), "GGUF")
    assert seconds < FAST


def test_truncated_safetensors_names_file_and_key(tmp_path, monkeypatch, capsys):
    model_dir = tmp_path / "tiny_model"
    tiny_llama(seed=0).save_pretrained(model_dir)
    weights = model_dir / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)
    code, err, _ = cli("train", [f"model.path={model_dir}", "model.name=tiny_saved", "debug=fast"], tmp_path,
                       monkeypatch, capsys)
    assert code == 2
    one_line(err, "train", "model.path", str(weights), "truncated")
    assert_nothing_complete(tmp_path / "run")


# ------------------------------------------------------------------ shape rules before any weight (default model)
@pytest.mark.parametrize("args, key", [
    (["adapter.r=7"], "adapter.r"),
    (["sparsity=nm2_4", "sparsity.n=2", "sparsity.m=7"], "sparsity.m"),
    (["calibration.seqlen=9000"], "calibration.seqlen"),
    (["eval.seqlen=9000"], "eval.seqlen"),
])
def test_shape_rules_on_the_default_model_before_loading(args, key, tmp_path, monkeypatch, capsys, no_weights):
    refused_fast(args=args, key=key, tmp_path=tmp_path, monkeypatch=monkeypatch, capsys=capsys)


def test_prune_py_nm_rule_before_loading(tmp_path, monkeypatch, capsys, no_weights):
    code, err, _ = cli("prune", ["sparsity.n=2", "sparsity.m=7"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "prune", "sparsity.m", "576")


# ------------------------------------------------------------------ data
def test_bad_alpaca_file_before_loading(tmp_path, monkeypatch, capsys, no_weights):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"instruction": "x", "output": "y"},\n  {oops}\n')
    code, err, _ = cli("train", [*TINY, f"data.source={bad}"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "train", "data.source", str(bad))


def test_alpaca_file_without_valid_records(tmp_path, monkeypatch, capsys, no_weights):
    bad = tmp_path / "empty.json"
    bad.write_text(json.dumps([{"instruction": 3}, {"output": None}]))
    code, err, _ = cli("train", [*TINY, f"data.source={bad}"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "train", "data.source", "no valid")


def test_empty_data_dir_is_an_error_not_the_samples(tmp_path, monkeypatch, capsys, no_weights):
    empty = tmp_path / "empty_data"
    empty.mkdir()
    code, err, _ = cli("eval", ["model=tiny", "eval.seqlen=64", f"data_dir={empty}"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "eval", "data_dir")
    code, err, _ = cli("train", ["model=tiny", "debug=fast", f"data_dir={empty}"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "train", "data_dir")
    with pytest.raises(FileNotFoundError):
        find_data("boolq/val.jsonl", empty)


def test_provenance_marks_truncated_samples():
    forget_data_reads()
    find_data("boolq/val.jsonl", SAMPLE_DATA_DIR)
    find_data("rte/val.jsonl", SAMPLE_DATA_DIR)
    rows = {r["path"]: r for r in data_provenance()}  # shipped: relative to the checkout (the recovery study)
    forget_data_reads()
    assert rows["data/boolq/val.jsonl"]["truncated_sample"] and rows["data/boolq/val.jsonl"]["shipped_sample"]
    assert not rows["data/rte/val.jsonl"]["truncated_sample"] and rows["data/rte/val.jsonl"]["root"] == "repo"
    assert len(rows["data/rte/val.jsonl"]["sha256"]) == 64


def test_provenance_is_relative_to_the_data_root_and_compares_bytes(tmp_path):
    """A copy of a shipped sample elsewhere is recorded relative to its data root and is a shipped sample (its
    bytes are); an edited copy is not; a file outside every root is recorded by name only."""
    for rel, edit in (("boolq/val.jsonl", False), ("rte/val.jsonl", True)):
        (tmp_path / rel).parent.mkdir(parents=True)
        text = (SAMPLE_DATA_DIR / rel).read_text()
        (tmp_path / rel).write_text(text + "\n" if edit else text)
    (tmp_path / "own.json").write_text('{"text": "x"}\n')
    forget_data_reads()
    find_data("boolq/val.jsonl", tmp_path)
    find_data("rte/val.jsonl", tmp_path)
    find_data(tmp_path / "own.json")
    rows = {r["path"]: r for r in data_provenance()}
    forget_data_reads()
    assert set(rows) == {"boolq/val.jsonl", "rte/val.jsonl", "own.json"}
    assert rows["boolq/val.jsonl"]["root"] == "data_root" and rows["own.json"]["root"] == "external"
    assert rows["boolq/val.jsonl"]["shipped_sample"] and rows["boolq/val.jsonl"]["truncated_sample"]
    assert not rows["rte/val.jsonl"]["shipped_sample"] and not rows["own.json"]["shipped_sample"]
    assert str(tmp_path) not in json.dumps(rows)


def test_eval_results_record_data_files(tmp_path, monkeypatch, capsys):
    module = importlib.import_module("eval")
    monkeypatch.setattr(sys, "argv", ["eval.py", f"--config-path={CONF_DIR}", "model=tiny", "eval.seqlen=64",
                                      "eval.max_windows=2", f"data_dir={SAMPLE_DATA_DIR}",
                                      f"run_dir={tmp_path / 'out'}",
                                      f"hydra.run.dir={tmp_path / 'hydra'}", "hydra.output_subdir=null",
                                      "print_config=false", "logger=csv"])
    module.main()
    payload = json.loads((tmp_path / "out" / "results.json").read_text())
    files = {Path(f["path"]).name: f for f in payload["meta"]["data_files"]}
    assert "test.json" in files and files["test.json"]["truncated_sample"] is False
    assert "Data files read" in (tmp_path / "out" / "results.md").read_text()


# ------------------------------------------------------------------ resume
def test_resume_with_other_adapter_r_names_the_key(tmp_path, monkeypatch, capsys, no_weights):
    job = tiny_job(tmp_path, "adapter.r=16")
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": {}, "spp_settings": settings_of(job)}, ckpt)
    code, err, _ = cli("train", [*TINY, "adapter.r=8", f"trainer.resume_from={ckpt}"], tmp_path, monkeypatch,
                       capsys)
    assert code == 2
    one_line(err, "train", "adapter.r=8", "16", "trainer.resume_from")


@pytest.mark.parametrize("then, now, named", [
    ("calibration.nsamples=4", "calibration.nsamples=2", ["calibration.nsamples=2", "(checkpoint: 4)",
                                                           "pruning.cache_key"]),
    ("pruner=sparsegpt", "pruner=sparsegpt pruner.percdamp=0.05", ["pruner.percdamp=0.05", "(checkpoint: 0.01)"]),
    ("pruner=sparsegpt", "pruner=wanda", ["pruner.name='wanda'", "pruner.percdamp=None"]),
    ("data.max_length=128", "data.max_length=96", ["data.max_length=96"]),
    ("trainer.lr=0.01", "trainer.lr=0.02", ["trainer.lr=0.02", "(checkpoint: 0.01)"]),
    ("objective=distill", "objective=ce", ["objective.name='ce'", "(checkpoint: 'distill')"]),
    ("objective=distill", "objective=distill objective.temperature=2", ["objective.temperature=2.0"]),
    ("reconstruct=blockwise", "reconstruct=none", ["reconstruction.cache_key=None"]),
])
def test_resume_after_other_pruning_data_or_training_names_every_key(then, now, named, tmp_path, monkeypatch, capsys,
                                                                    no_weights):
    """Other masks (calibration, pruner settings), data or optimisation are refused in one line."""
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": {}, "spp_settings": settings_of(tiny_job(tmp_path, then))}, ckpt)
    code, err, _ = cli("train", [*TINY, *now.split(), f"trainer.resume_from={ckpt}"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "train", *named, "trainer.resume_from")


def test_resume_with_the_same_reconstruction_passes(tmp_path):
    """Negative control of the reconstruction row above: the checkpoint's own reconstruction is accepted (the
    preflight's key is the one the run stamps, the form's resolved options included)."""
    from spp.training.resume_checks import check_resume
    from spp.training.run import build_run

    job = tiny_job(tmp_path, "reconstruct=blockwise")
    ckpt = tmp_path / "old.ckpt"
    run = build_run(job, tmp_path / "run")
    torch.save({"state_dict": {}, "spp_settings": settings_of(job, run.identity)}, ckpt)
    check_resume(job, ckpt)


def test_validation_interval_beyond_the_epoch_is_refused_before_pruning(tmp_path, monkeypatch, capsys, no_weights):
    """An int ``trainer.val_check_interval`` above the epoch's training batches on each rank (Lightning refuses it
    once the model is pruned) is one line naming the key and the largest value that works."""
    code, err, _ = cli("train", [*TINY, "trainer.val_check_interval=100000"], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, "train", "trainer.val_check_interval=100000", "training batches")
    from spp.training.val_schedule import check_validation_interval

    check_validation_interval(tiny_job(tmp_path, "trainer.val_check_interval=8"), 29)  # 29 examples, 4 a batch: 8
    check_validation_interval(tiny_job(tmp_path, "trainer.val_check_interval=9", "trainer.limit_val_batches=0"), 29)
    with pytest.raises(UserError, match="at most 8"):
        check_validation_interval(tiny_job(tmp_path, "trainer.val_check_interval=9"), 29)


def test_resume_from_a_checkpoint_older_than_the_settings_warns(tmp_path, caplog):
    """A checkpoint holding only the first settings (adapter, model name/path, pruner name, sparsity) is resumed;
    the settings it predates are named in a warning, not compared."""
    from spp.training.resume_checks import check_resume

    job = tiny_job(tmp_path)
    now = settings_of(job)
    old = {"adapter": now["adapter"], "model": {k: now["model"][k] for k in ("name", "path")},
           "pruner": {"name": now["pruner"]["name"]}, "sparsity": now["sparsity"]}
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": {}, "spp_settings": old}, ckpt)
    with caplog.at_level("WARNING"):
        check_resume(job, ckpt)
    warning = caplog.text
    for name in ("model.weights", "pruner.targets", "calibration.*", "pruning.*", "data.*", "trainer.*"):
        assert name in warning, (name, warning)


def test_resume_settings_hold_what_decides_the_pruned_weights(tmp_path):
    settings = settings_of(tiny_job(tmp_path))
    assert settings["model"]["weights"].startswith("tiny-") and settings["pruning"]["cache_key"]
    assert settings["calibration"]["file_sha256"] and settings["calibration"]["nsamples"] == 4
    assert {"targets", "true_sequential"} <= set(settings["pruner"])
    assert settings["data"]["max_length"] == 128 and settings["trainer"]["lr"] > 0


def test_missing_resume_checkpoint(tmp_path, monkeypatch, capsys, no_weights):
    code, err, _ = cli("train", [*TINY, f"trainer.resume_from={tmp_path / 'nope.ckpt'}"], tmp_path, monkeypatch,
                       capsys)
    assert code == 2
    one_line(err, "train", "trainer.resume_from")


def test_checkpoints_carry_their_settings(tmp_path):
    settings = settings_of(tiny_job(tmp_path))
    checkpoint: dict = {}
    GuardsCallback(settings).on_save_checkpoint(None, None, checkpoint)
    assert checkpoint["spp_settings"]["adapter"]["r"] == settings["adapter"]["r"]


# ------------------------------------------------------------------ guards during the run
def _trainer(step: int = 3, lr: float = 1e3) -> SimpleNamespace:
    param = torch.nn.Parameter(torch.zeros(2))
    return SimpleNamespace(global_step=step, world_size=1, precision="32-true",
                           optimizers=[torch.optim.SGD([param], lr=lr)])


def test_nonfinite_loss_stops_naming_step_and_lr():
    with pytest.raises(DivergedError) as exc:
        GuardsCallback().on_train_batch_end(_trainer(), None, {"loss": torch.tensor(float("nan"))}, None, 0)
    assert "step 3" in str(exc.value) and "1000" in str(exc.value) and "trainer.lr" in str(exc.value)


def test_nonfinite_gradient_norm_stops():
    module = torch.nn.Linear(2, 2)
    module.weight.grad = torch.full_like(module.weight, float("inf"))
    with pytest.raises(DivergedError, match="gradient norm is inf at step 3"):
        GuardsCallback().on_before_optimizer_step(_trainer(), module, None)
    module.weight.grad = torch.ones_like(module.weight)
    GuardsCallback().on_before_optimizer_step(_trainer(), module, None)  # finite: no stop


def test_divergence_rules():
    job = SimpleNamespace(guards=SimpleNamespace(enabled=True, max_ppl_ratio=2.0, loss_must_fall=True),
                          adapter=SimpleNamespace(name="spp"))
    pruned = SimpleNamespace(ppl={"pruned": {"ppl": 228.0}})
    falling = SimpleNamespace(train_losses=[4.35, 4.0, 3.9, 3.8])
    assert divergence(job, pruned, falling, SimpleNamespace(ppl={"ppl": 300.0})) == []
    assert "max_ppl_ratio" in divergence(job, pruned, falling, SimpleNamespace(ppl={"ppl": 49152.0}))[0]
    assert "nan" in divergence(job, pruned, falling, SimpleNamespace(ppl={"ppl": float("nan")}))[0]
    rising = SimpleNamespace(train_losses=[4.35, 6.0, 9.0, 10.8])
    assert "exceeds the first" in divergence(job, pruned, rising, SimpleNamespace(ppl={"ppl": 300.0}))[0]
    job.guards.enabled = False
    assert divergence(job, pruned, rising, SimpleNamespace(ppl={"ppl": 49152.0})) == []


def test_diverged_run_is_not_exported_as_success(tmp_path, monkeypatch, capsys):
    """The merged model scores far worse than the pruned one (here: its measured perplexity x 1000): summary.json
    says diverged, the run raises (train.py: one line, exit 2), adapter and checkpoints stay, nothing at merged/:
    the export is at merged.diverged/ with status diverged."""
    measure = finalize_module.evaluate

    def worse(*args, **kwargs):
        out = measure(*args, **kwargs)
        out.ppl = {**out.ppl, "ppl": out.ppl["ppl"] * 1000}
        return out

    monkeypatch.setattr(finalize_module, "evaluate", worse)
    job = tiny_job(tmp_path)
    with pytest.raises(DivergedError, match="max_ppl_ratio"):
        run_job(job)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged"] and summary["outputs"]["merged_dir"] is None
    assert not (tmp_path / "run" / "merged").exists() and not list((tmp_path / "run").glob(".merged.*"))
    moved = tmp_path / "run" / finalize_module.DIVERGED_DIR
    assert json.loads((moved / "spp_export.json").read_text())["status"] == "diverged"
    assert (tmp_path / "run" / "adapter").is_dir() and list((tmp_path / "run" / "checkpoints").glob("*.ckpt"))
    assert summary["data_files"]
    printed = capsys.readouterr().out
    assert "status: diverged" in printed and "data: " in printed


# ------------------------------------------------------------------ non-finite numbers are never cached
def test_nan_calibration_activations_are_refused_and_not_cached(tmp_path, tiny_tok):
    model = tiny_llama(seed=0)
    with torch.no_grad():
        model.model.layers[0].input_layernorm.weight[0] = float("nan")
    with pytest.raises(UserError, match="not finite"):
        get_or_reconstruct(model, tiny_tok, ModelConfig(name="tiny", path="tiny"), PrunerConfig(name="wanda"),
                           SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                           CalibrationConfig(nsamples=2, seqlen=32), ReconstructConfig(), tmp_path / "cache",
                           str(SAMPLE_DATA_DIR))
    assert not list((tmp_path / "cache").rglob("manifest.json"))


def test_nan_perplexity_is_not_cached(tmp_path, tiny_tok):
    model = tiny_llama(seed=0)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    off = OffloadedModel(model, DistContext())
    res = cached_offloaded_perplexity(off, tiny_tok, EvalConfig(seqlen=32, max_windows=1), "nan-model", tmp_path,
                                      str(SAMPLE_DATA_DIR))
    assert not math.isfinite(res["ppl"])
    assert not list(tmp_path.rglob("*.json"))


# ------------------------------------------------------------------ leftovers
def test_stale_temporaries_are_removed_with_a_log_line(tmp_path, caplog):
    run = tmp_path / "run"
    (run / ".merged.abc123").mkdir(parents=True)
    (run / ".merged.abc123" / "model.safetensors").write_bytes(b"x" * 10)
    (run / ".adapter.x1").mkdir()
    (run / ".summary.json.q.tmp").write_text("{")
    (run / "adapter").mkdir()
    entry = tmp_path / "cache" / "pruning" / "e1"
    entry.mkdir(parents=True)
    old, fresh = entry / ".state.safetensors.a.tmp", entry / ".state.safetensors.b.tmp"
    old.write_bytes(b"0")
    fresh.write_bytes(b"0")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    with caplog.at_level("WARNING"):
        removed = remove_stale_temporaries(run, [tmp_path / "cache" / "pruning"])
    assert sorted(Path(p).name for p in removed) == sorted([".merged.abc123", ".adapter.x1", ".summary.json.q.tmp",
                                                            old.name])
    assert (run / "adapter").is_dir() and fresh.exists() and not old.exists()
    assert "removed a temporary left by a killed run" in caplog.text


def test_a_folder_write_that_fails_at_the_rename_puts_the_previous_folder_back(tmp_path, monkeypatch):
    import spp.atomic as atomic

    target = tmp_path / "merged"
    target.mkdir()
    (target / "model.safetensors").write_text("the previous export")

    def refused(tmp, path, directory=False):  # the rename into place fails (or the job is interrupted there)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "publish", refused)
    with pytest.raises(OSError, match="No space left"):
        atomic.write_dir_atomic(target, lambda tmp: (tmp / "model.safetensors").write_text("new"))
    assert (target / "model.safetensors").read_text() == "the previous export"
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]  # no temporary folder left beside it
    monkeypatch.undo()  # negative control: the same write, allowed to finish, replaces the folder
    atomic.write_dir_atomic(target, lambda tmp: (tmp / "model.safetensors").write_text("new"))
    assert (target / "model.safetensors").read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["merged"]


# ------------------------------------------------------------------ what worked keeps working
def test_killed_prune_write_leaves_no_loadable_entry(tmp_path, tiny_tok, monkeypatch):
    args = (ModelConfig(name="tiny", path="tiny"), PrunerConfig(name="magnitude"),
            SparsityConfig(name="nm2_4", kind="nm", n=2, m=4), CalibrationConfig(nsamples=2, seqlen=32),
            ReconstructConfig(), tmp_path / "cache", str(SAMPLE_DATA_DIR))

    def killed(path, data):  # the process dies half-way through writing a cache file
        Path(path).write_bytes(data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "_atomic_write_bytes", killed)
    with pytest.raises(KeyboardInterrupt):
        get_or_reconstruct(tiny_llama(seed=0), tiny_tok, *args)
    monkeypatch.undo()
    again, _ = get_or_reconstruct(tiny_llama(seed=0), tiny_tok, *args)
    assert not again.cache_hit


def test_malformed_alpaca_records_are_skipped_and_counted(tmp_path, caplog):
    data = tmp_path / "mixed.json"
    data.write_text(json.dumps([{"instruction": "a", "output": "b"}, {"instruction": 1},
                                {"instruction": "c", "input": "d", "output": "e"}]))
    with caplog.at_level("WARNING"):
        assert check_data_source(str(data), None) == 2
    assert "1" in caplog.text


def test_eval_py_unknown_task_is_one_line(tmp_path, monkeypatch, capsys, no_weights):
    code, err, _ = cli("eval", ["model=tiny", "eval.tasks=[no_such_task]", f"data_dir={SAMPLE_DATA_DIR}"], tmp_path,
                       monkeypatch, capsys)
    assert code == 2
    one_line(err, "eval", "no_such_task")


def test_internal_errors_keep_their_traceback():
    assert as_user_error(RuntimeError("bug")) is None
    assert as_user_error(ValueError("shape mismatch in a kernel")) is None
    assert as_user_error(FileNotFoundError("model.path='/x' does not exist")).key == "model.path"


def test_a_user_error_survives_pickling_as_ranks_broadcast_it():
    """Rank 0's error reaches the other ranks through ``broadcast_object`` (pickle): every field must survive
    (before, unpickling raised TypeError on the other ranks instead of the one line)."""
    import pickle

    from spp.errors import DivergedError

    for err in (UserError("the lock is held", "wait", key="cache_lock_timeout_s", path="/c/x.lock"),
                DivergedError("loss blew up", "lower trainer.lr", key="guards")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
        assert (back.what, back.fix, back.key, back.path) == (err.what, err.fix, err.key, err.path)
