"""The recovery curve (``trainer.curve_every_n_steps``): the merged model's ``wikitext2_val``
perplexity along one run, against the training CPU time. Its last point is the final merged evaluation (SPP and
LoRA*, re-masked), and training is bit for bit the same with the curve on or off."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from safetensors.torch import load_file
from train_helpers import compose_train, tiny_job

from spp.errors import UserError
from spp.eval.perplexity import WIKITEXT2_VAL, gap_closed, paired_difference, perplexity
from spp.paths import SAMPLE_DATA_DIR
from spp.training.callbacks.recovery_curve import CURVE_FILE, RecoveryCurve
from spp.training.config import load_job
from train import run_job

FAST = ["eval.extra_ppl_sources=[wikitext2_val]", "eval.window_sampling=systematic", "dense_ppl=false",
        "pruned_ppl=false", "sample.enabled=false", "export.merged=false", "logger=csv"]


class UnmergedPerplexity(L.Callback):
    """Negative control: the live (unmerged) model's ``wikitext2_val`` perplexity when training ends."""

    def __init__(self) -> None:
        self.result = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.result = perplexity(pl_module.model, trainer.datamodule.tokenizer, WIKITEXT2_VAL, seqlen=128,
                                 max_windows=2, data_dir=SAMPLE_DATA_DIR, sampling="systematic")


def _curve(run: Path) -> dict:
    return json.loads((run / CURVE_FILE).read_text())


def _check_last_point_is_final(summary: dict, run: Path) -> dict:
    points = summary["recovery_curve"]
    assert points == _curve(run)["points"]  # the file and summary.json hold the same points
    last, final = points[-1], summary["merged_ppl_by_source"][WIKITEXT2_VAL]
    assert last["step"] == summary["losses"]["optimizer_steps"]
    assert last["ppl"] == pytest.approx(final["ppl"], rel=1e-5, abs=1e-5)
    assert last["window_nll"] == pytest.approx(final["window_nll"], abs=1e-5)
    assert last["window_starts"] == final["window_starts"] and last["windows"] == final["windows"]
    paired_difference(last, final)  # the points are perplexity results on the final evaluation's windows
    gap_closed({**points[0], "window_nll": [v - 1.0 for v in points[0]["window_nll"]]}, points[0], last)
    cpu = [p["train_cpu_s"] for p in points]
    assert cpu[0] == 0.0 and points[0]["train_wall_s"] == 0.0 and all(c > 0 for c in cpu[1:])
    assert cpu == sorted(cpu)
    return last


def test_spp_curve_ends_at_the_merged_evaluation_and_leaves_training_unchanged(tmp_path):
    on = run_job(tiny_job(tmp_path, *FAST, "adapter=spp", "trainer.curve_every_n_steps=2", run="on"))
    _check_last_point_is_final(on, tmp_path / "on")
    assert [p["step"] for p in on["recovery_curve"]] == [0, 2, 4, 6]
    assert on["recovery_curve"][0]["ppl"] != on["recovery_curve"][-1]["ppl"]  # training moved it
    off = run_job(tiny_job(tmp_path, *FAST, "adapter=spp", run="off"))
    assert off["recovery_curve"] is None and not (tmp_path / "off" / CURVE_FILE).exists()
    assert on["losses"]["train"] == off["losses"]["train"]  # bit for bit
    a, b = (load_file(tmp_path / r / "adapter" / "adapter_model.safetensors") for r in ("on", "off"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for source, result in off["merged_ppl_by_source"].items():
        assert on["merged_ppl_by_source"][source]["window_nll"] == result["window_nll"]


@pytest.mark.slow  # a training run (11 s); the SPP curve stays in the default suite; CI runs it
def test_lora_star_curve_is_re_masked_and_steps_follow_the_optimizer(tmp_path):
    """LoRA*: the curve's last point is the re-masked export's perplexity, not the unmerged LoRA forward's; with
    gradient accumulation the points sit at optimiser steps 0, 3 and the last (4: the epoch's odd batch)."""
    control = UnmergedPerplexity()
    summary = run_job(tiny_job(tmp_path, *FAST, "adapter=lora", "trainer.curve_every_n_steps=3",
                               "trainer.accumulate_grad_batches=2"), callbacks=[control])
    last = _check_last_point_is_final(summary, tmp_path / "run")
    assert [p["step"] for p in summary["recovery_curve"]] == [0, 3, 4]
    assert not math.isclose(control.result.ppl, last["ppl"], rel_tol=1e-4)  # unmerged LoRA ≠ re-masked LoRA*


@pytest.mark.parametrize(("extra", "says"), [
    (["trainer.curve_every_n_steps=0"], "trainer.curve_every_n_steps=0 must be >= 1"),
    (["trainer.curve_every_n_steps=5", "eval.ppl=false"], "eval.ppl=false"),
    (["trainer.curve_every_n_steps=5", "trainer.devices=2"], "needs one process (trainer.devices=1)"),
    (["trainer.curve_every_n_steps=5", "trainer.num_nodes=2"], "needs one process (trainer.devices=1)"),
])
def test_refused_in_one_line_before_any_model_is_loaded(tmp_path, extra, says):
    with pytest.raises(UserError, match=r".*") as err:
        load_job(compose_train(["model=tiny", f"run_dir={tmp_path}", *extra]))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_more_processes_than_the_config_said_are_refused_at_setup(tmp_path):
    curve = RecoveryCurve(tmp_path / CURVE_FILE, 5, None, None, None)
    with pytest.raises(UserError, match=r"needs one process \(trainer.devices=1\): this job runs 2"):
        curve.setup(SimpleNamespace(world_size=2), None, "fit")
