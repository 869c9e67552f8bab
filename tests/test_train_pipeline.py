"""Tiny end-to-end training job: prune -> SPP -> train -> merge -> export -> reload with AutoModelForCausalLM."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import tiny_job
from transformers import AutoModelForCausalLM

import spp
from spp.models import load_model
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.phase import get_or_reconstruct
from spp.training.trainer import THROUGHPUT_KEY
from train import run_job

STEPS = ["trainer.lr=0.05", "trainer.max_steps=16", "data.max_examples=68", "adapter.dropout=0.0"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    cfg = tiny_job(tmp, *STEPS)
    summary = run_job(cfg)
    return tmp, cfg, summary


def _pruned_tiny(cfg, cache):
    model, tok = load_model(cfg.model)
    result, _ = get_or_reconstruct(model, tok, cfg.model, cfg.pruner, cfg.sparsity, cfg.calibration,
                                   ReconstructConfig(), cache_dir=cache, data_dir=cfg.data_dir)
    return model, tok, result


def test_loss_falls_and_files_are_written(tiny_run):
    tmp, _, summary = tiny_run
    losses = summary["losses"]
    assert losses["optimizer_steps"] == 16
    assert len(losses["train"]) == 16
    # one epoch = 64 examples / 4 = 16 steps, then validation
    assert len(losses["val"]) == 1 and 4.0 < losses["val"][0] < 6.0
    assert losses["train_last"] < losses["train_first"] - 0.05
    run = tmp / "run"
    for rel in ("summary.json", "resolved_config.yaml", "csv/metrics.csv", "adapter/adapter_config.json",
                "adapter/adapter_model.safetensors", "merged/config.json", "merged/model.safetensors.index.json",
                "merged/tokenizer.json", "checkpoints/last.ckpt"):
        assert (run / rel).is_file(), rel
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["losses"]["train"] == pytest.approx(losses["train"])
    assert {"python", "torch", "lightning", "transformers"} <= set(on_disk["versions"])
    assert on_disk["config"]["adapter"]["r"] == 16
    metrics = (run / "csv/metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/loss", THROUGHPUT_KEY, "lr-AdamW", "params/trainable", "params/frozen"} <= set(metrics)


def test_sparsity_preserved_and_counted(tiny_run):
    _, cfg, summary = tiny_run
    sp = summary["sparsity"]
    assert sp["target"] == 0.5 and sp["before"] == 0.5 and sp["after"] == 0.5
    assert [a["when"] for a in sp["audits"]][0] == "fit_start"
    assert sp["audits"][-1]["when"] == "merged"
    # trainable = sum over the 7 projections of r*n + m (Table 1), tiny: hidden 64, inter 128, kv 32.
    h, i, kv, r, layers = 64, 128, 32, 16, 2
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    expected = layers * sum(r * n + m for m, n in shapes)
    assert summary["params"]["trainable"] == expected
    frozen = sum(p.numel() for p in load_model(cfg.model, with_tokenizer=False)[0].parameters())
    assert summary["params"]["frozen"] == frozen
    ppl = summary["perplexity"]
    assert ppl["dense"]["ppl"] > 1 and ppl["pruned"]["ppl"] > 1 and ppl["merged"]["ppl"] > 1
    assert ppl["merged"]["ppl"] < ppl["pruned"]["ppl"]


def test_reloaded_model_has_mask_zeros_and_same_logits(tiny_run):
    tmp, cfg, summary = tiny_run
    reloaded = AutoModelForCausalLM.from_pretrained(tmp / "run" / "merged").eval()
    # the job's greedy completion of the fixed prompt is the reloaded merged model's
    from spp.generation import generate_text

    tokenizer = load_model(cfg.model)[1]
    again = generate_text(reloaded, tokenizer, cfg.sample.prompt, max_new_tokens=cfg.sample.max_new_tokens)
    assert summary["samples"]["merged"]["completion"] == again.completion
    assert {"dense", "pruned", "merged"} <= set(summary["samples"])
    model, tok, result = _pruned_tiny(cfg, tmp / "cache")
    assert result.cache_hit, "the pruned weights must come from the cache written by the run"
    weights = dict(reloaded.named_parameters())
    for name, mask in result.masks.items():
        w = weights[f"{name}.weight"]
        assert torch.equal(w == 0, ~mask), name
    # in-memory merged model rebuilt from the exported adapter files
    spp.inject(model, targets=tuple(cfg.adapter.targets), r=16, dropout=0.0)
    spp.load_adapter(model, tmp / "run" / "adapter")
    adapter = load_file(tmp / "run" / "adapter" / "adapter_model.safetensors")
    assert any(bool((t != 0).any()) for k, t in adapter.items() if k.endswith("spp_beta"))
    merged = spp.merge_and_unload(model).eval()
    ids = tok("Below is an instruction that describes a task.", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, merged(ids).logits, rtol=0, atol=1e-6)


def test_resume_from_mid_run_checkpoint_matches_uninterrupted(tiny_run, tmp_path):
    """Stop after 8 of 16 steps (checkpoint), resume, and end with the uninterrupted run's adapter."""
    import lightning as L

    class StopAt(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step >= 8:
                trainer.should_stop = True

    tmp, _, _ = tiny_run
    cache = f"cache_dir={tmp / 'cache'}"
    first = tiny_job(tmp_path, *STEPS, cache, "trainer.checkpoint_every_n_steps=8", "dense_ppl=false",
                     "pruned_ppl=false", "eval=none", run="interrupted")
    run_job(first, callbacks=[StopAt()])
    ckpt = tmp_path / "interrupted" / "checkpoints" / "adapter-step000008.ckpt"
    assert ckpt.is_file()
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert state["state_dict"] and all("spp_alpha" in k or "spp_beta" in k for k in state["state_dict"])
    assert state["optimizer_states"] and state["lr_schedulers"]
    resumed_cfg = tiny_job(tmp_path, *STEPS, cache, f"trainer.resume_from={ckpt}", "dense_ppl=false",
                           "pruned_ppl=false", "eval=none", run="resumed")
    resumed = run_job(resumed_cfg)
    assert resumed["losses"]["optimizer_steps"] == 16
    full = load_file(tmp / "run" / "adapter" / "adapter_model.safetensors")
    again = load_file(tmp_path / "resumed" / "adapter" / "adapter_model.safetensors")
    assert full.keys() == again.keys()
    for key in full:
        torch.testing.assert_close(again[key], full[key], rtol=0, atol=1e-6, msg=key)


def _offline_wandb(monkeypatch, tmp_path) -> tuple[list[str], dict]:
    """W&B offline with its config / cache under ``tmp_path``; the logger overrides of a table sweep.

    Returns the overrides and a dict that receives the W&B run's group, tags and summary just before the
    pipeline finishes the run (wandb 0.31 offline runs keep these only inside the binary ``.wandb`` file).
    """
    import wandb

    import spp.commands.train as pipeline

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    seen: dict = {}
    finish = pipeline.finish_wandb

    def capture_then_finish() -> None:
        if wandb.run is not None:
            seen.update(group=wandb.run.group, tags=set(wandb.run.tags), summary=dict(wandb.run.summary))
        finish()

    monkeypatch.setattr(pipeline, "finish_wandb", capture_then_finish)
    overrides = ["logger=[csv,wandb]", "logger.wandb.group=table4_lora_star", "logger.wandb.tags=[table4_lora_star]"]
    return overrides, seen


def _final_row(run_dir) -> dict[str, float]:
    """The row of ``csv/metrics.csv`` holding the ``final/...`` metrics."""
    import csv

    with open(run_dir / "csv" / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("final/ppl_merged")]
    assert len(rows) == 1
    return {k: float(v) for k, v in rows[0].items() if k.startswith("final/") and v}


def test_lora_star_baseline_is_remasked(tiny_run, tmp_path, monkeypatch):
    tmp, _, _ = tiny_run
    loggers, seen = _offline_wandb(monkeypatch, tmp_path)
    summary = run_job(tiny_job(tmp_path, "adapter=lora", f"cache_dir={tmp / 'cache'}", *loggers))
    assert summary["pruning"]["cache_hit"] is True
    assert summary["merge"]["pruned_made_nonzero"] > 0  # dense LoRA update touched pruned weights...
    assert summary["sparsity"]["after"] == summary["sparsity"]["before"] == 0.5  # ...and re-masking removed it
    h, i, kv, r = 64, 128, 32, 8  # LoRA params per layer: r * (in + out)
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    assert summary["params"]["trainable"] == 2 * sum(r * (m + n) for m, n in shapes)
    assert (tmp_path / "run" / "adapter" / "adapter_config.json").is_file()
    # the sweep's W&B group / tags are the summary's, and the end results reach CSV and the W&B run summary
    assert summary["run"]["group"] == "table4_lora_star"
    assert {"table4_lora_star", "lora", "r8"} <= set(summary["run"]["tags"])
    removed = summary["merge"]["removed_fraction"]
    assert 0 < removed < 1
    final = _final_row(tmp_path / "run")
    assert final["final/remask_removed_fraction"] == pytest.approx(removed)
    assert final["final/ppl_merged"] == pytest.approx(summary["perplexity"]["merged"]["ppl"])
    assert final["final/ppl_pruned"] == pytest.approx(summary["perplexity"]["pruned"]["ppl"])
    assert final["final/sparsity_after"] == 0.5
    assert seen["group"] == "table4_lora_star" and set(summary["run"]["tags"]) == seen["tags"]
    assert seen["summary"]["final/remask_removed_fraction"] == pytest.approx(removed)
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))  # what `wandb sync` uploads


def test_adapter_none_exports_the_pruned_model(tiny_run, tmp_path, monkeypatch):
    tmp, _, _ = tiny_run
    loggers, seen = _offline_wandb(monkeypatch, tmp_path)
    summary = run_job(tiny_job(tmp_path, "adapter=none", f"cache_dir={tmp / 'cache'}", *loggers))
    assert summary["params"]["trainable"] == 0 and summary["losses"]["optimizer_steps"] == 0
    assert summary["perplexity"]["merged"]["ppl"] == pytest.approx(summary["perplexity"]["pruned"]["ppl"], rel=1e-9)
    assert summary["sparsity"]["after"] == 0.5
    assert (tmp_path / "run" / "merged" / "model.safetensors.index.json").is_file()
    # no training loop, yet the pruned-only row is a W&B run of the table's group with its perplexity
    assert summary["run"]["group"] == "table4_lora_star"
    assert seen["group"] == "table4_lora_star" and "none" in seen["tags"]
    on_wandb = seen["summary"]
    assert on_wandb["final/ppl_merged"] == pytest.approx(summary["perplexity"]["merged"]["ppl"])
    assert "final/remask_removed_fraction" not in on_wandb
