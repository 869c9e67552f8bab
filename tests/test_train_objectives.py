"""Training objectives end to end: ``experiment=tiny_smoke objective=distill`` with SPP and LoRA* (zeros audited
before and after the merge), ``objective=ce`` giving bitwise the adapter of the training step as it was before
objectives were plug-ins, and distillation under FSDP2 on 2 gloo processes (the teacher sharded like the student)
giving the single process's adapter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import compose_train

from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from spp.training.config import load_job
from spp.training.module import SPPModule
from train import run_job

SMOKE = ["experiment=tiny_smoke", "logger=csv", "trainer.progress_bar=none", f"data_dir={SAMPLE_DATA_DIR}"]


def _smoke(tmp: Path, name: str, *extra: str) -> dict:
    job = load_job(compose_train([*SMOKE, f"run_dir={tmp / name}", f"cache_dir={tmp / 'cache'}", *extra]))
    return run_job(job)


def _zeros_kept(summary: dict) -> list[str]:
    audits = summary["sparsity"]["audits"]
    assert audits[0]["when"] == "fit_start" and audits[-1]["when"] == "merged", [a["when"] for a in audits]
    assert all(a["kept_zeros_changed"] == 0 and a["zeros"] == audits[0]["zeros"] for a in audits), audits
    assert summary["sparsity"]["before"] == summary["sparsity"]["after"] == 0.5
    return [a["when"] for a in audits]


@pytest.mark.parametrize("adapter", ["spp", pytest.param("lora", marks=pytest.mark.slow)])  # lora: 8 s, CI
def test_tiny_smoke_distills_from_the_dense_model(tmp_path, adapter):
    """``python train.py experiment=tiny_smoke objective=distill adapter=<adapter>``: every zero audited at fit start,
    at the checkpoint and after the merge; the logged CE and the terms are there; the teacher is the *dense* model:
    the student starts as the pruned model (SPP's beta and LoRA's B are zero), so a pruned teacher would give a
    first KL and feature term of zero."""
    summary = _smoke(tmp_path, adapter, "objective=distill", f"adapter={adapter}")
    assert summary["status"] == "ok" and summary["run"]["objective"] == "distill"
    _zeros_kept(summary)
    parts = summary["losses"]["train_parts"]
    assert set(parts) == {"ce", "kl", "feature"} and len(parts["kl"]) == summary["losses"]["optimizer_steps"] == 6
    assert parts["kl"][0] > 1e-5 and parts["feature"][0] > 1e-4
    assert summary["losses"]["train"][0] == pytest.approx(parts["kl"][0] + parts["feature"][0], rel=1e-5)
    header = (tmp_path / adapter / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/loss", "train/ce", "train/kl", "train/feature"} <= set(header)
    assert (tmp_path / adapter / "adapter" / "adapter_model.safetensors").is_file()


def _legacy_training_step(self, batch, batch_idx):
    """``SPPModule.training_step`` verbatim as it was before objectives were plug-ins (commit 5d64224)."""
    run = self._compiled[0] if self._compiled else self.model
    loss = run(**batch, use_cache=False).loss
    self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=batch["input_ids"].size(0))
    self._losses.append(loss.detach())
    return loss


@pytest.mark.slow  # two training runs (10 s); CI runs it
def test_objective_ce_trains_bitwise_the_adapter_of_the_old_training_step(tmp_path, monkeypatch):
    new = _smoke(tmp_path, "new", "objective=ce")
    monkeypatch.setattr(SPPModule, "training_step", _legacy_training_step)
    old = _smoke(tmp_path, "old", "objective=ce")
    assert (tmp_path / "new/adapter/adapter_model.safetensors").read_bytes() == \
        (tmp_path / "old/adapter/adapter_model.safetensors").read_bytes()
    assert new["losses"]["train"] == old["losses"]["train"] and "train_parts" not in new["losses"]
    assert new["perplexity"]["merged"]["ppl"] == old["perplexity"]["merged"]["ppl"]


# One micro-batch of one 48-byte example per rank and step (global batch 4): each micro-batch's loss is one
# example's, so 2 ranks x 2 micro-batches and 1 process x 4 micro-batches average the same four losses, the
# per-example-normalised feature term included.
FSDP_COMMON = ["model=tiny", "debug=fast", "pruner=wanda", "sparsity=nm2_4", "eval=none", "dense_ppl=false",
               "pruned_ppl=false", "adapter.dropout=0.0", "data.max_length=48", "trainer.max_steps=3",
               "trainer.lr=0.05", "data.train_batch_size=1", "trainer.global_batch_size=4", "objective=distill",
               "objective.temperature=2.0", "objective.ce_weight=0.5", f"data_dir={SAMPLE_DATA_DIR}"]


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_distill_under_fsdp2_on_two_processes_matches_one_process(tmp_path):
    reference = run_job(load_job(compose_train([*FSDP_COMMON, f"run_dir={tmp_path / 'one'}",
                                                f"cache_dir={tmp_path / 'cache'}"])))
    run = tmp_path / "fsdp"
    args = [*FSDP_COMMON, "strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", f"run_dir={run}",
            f"cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads((run / "summary.json").read_text())
    assert _zeros_kept(summary)[-1] == "merged" and summary["losses"]["optimizer_steps"] == 3
    assert summary["losses"]["train_parts"]["kl"][0] > 0
    one = load_file(tmp_path / "one" / "adapter" / "adapter_model.safetensors")
    two = load_file(run / "adapter" / "adapter_model.safetensors")
    assert one.keys() == two.keys() and any(bool((v != 0).any()) for k, v in two.items() if k.endswith("spp_beta"))
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert reference["losses"]["train_parts"]["kl"][0] > 0
