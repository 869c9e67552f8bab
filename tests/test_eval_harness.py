"""lm-eval on a tiny model: finite accuracies for every task, aggregation as lm-eval/the paper define it,
and the ``lm_eval`` command line on a saved directory gives the same per-document log-likelihoods."""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from transformers import AutoModelForCausalLM

from spp.eval.harness import evaluate_tasks, zero_shot_mean, zero_shot_mean_stderr
from spp.eval.mmlu_tasks import CATEGORIES, MMLU_SUBJECTS
from spp.eval.task_table import PAPER_MEAN_TASKS, TASK_DIR


@pytest.fixture(scope="module")
def run(sample_data_dir):
    from spp.models.tiny import tiny_llama, tiny_tokenizer

    return evaluate_tasks(tiny_llama(seed=0), tiny_tokenizer(), ["spp_zeroshot", "spp_mmlu"], limit=1,
                          data_dir=sample_data_dir)


def test_every_task_returns_a_finite_accuracy(run):
    for task in [*PAPER_MEAN_TASKS, *(f"spp_mmlu_{s}" for s in MMLU_SUBJECTS)]:
        acc = run.metrics[task]["acc"]
        assert math.isfinite(acc) and 0.0 <= acc <= 1.0, task
        assert run.metrics[task]["n"] == 1
    for task in ("spp_hellaswag", "spp_arc_easy", "spp_arc_challenge", "spp_openbookqa"):
        assert 0.0 <= run.metrics[task]["acc_norm"] <= 1.0
    assert "acc_norm" not in run.metrics["spp_boolq"]
    assert run.num_fewshot["spp_mmlu_anatomy"] == 5 and run.num_fewshot["spp_boolq"] == 0


def test_group_aggregates(run):
    # the zero-shot group is the unweighted mean of the seven acc (the paper's "Average")
    mean = sum(run.metrics[t]["acc"] for t in PAPER_MEAN_TASKS) / 7
    assert run.metrics["spp_zeroshot"]["acc"] == pytest.approx(mean, abs=1e-12)
    assert zero_shot_mean(run.metrics) == pytest.approx(mean, abs=1e-12)
    # MMLU: every subject has n=1 document, so size weighting reduces to the plain subject mean
    subj = [run.metrics[f"spp_mmlu_{s}"]["acc"] for s in MMLU_SUBJECTS]
    assert run.mmlu_acc == pytest.approx(sum(subj) / 57, abs=1e-12)
    for cat in CATEGORIES:
        accs = [run.metrics[f"spp_mmlu_{s}"]["acc"] for s, c in MMLU_SUBJECTS.items() if c == cat]
        assert run.metrics[f"spp_mmlu_{cat}"]["acc"] == pytest.approx(sum(accs) / len(accs), abs=1e-12)
    assert run.zero_shot_mean == pytest.approx(mean)


@pytest.mark.slow  # a second lm-eval run through its command line (17 s)
def test_command_line_equals_in_memory(tmp_path, tiny_model, tiny_tok, sample_data_dir):
    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tok.save_pretrained(model_dir)
    reloaded = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(reloaded).__name__ == "LlamaForCausalLM"

    tasks = ["spp_arc_easy", "spp_winogrande", "spp_mmlu_astronomy"]
    mem = evaluate_tasks(tiny_model, tiny_tok, tasks, limit=3, data_dir=sample_data_dir, log_samples=True)
    cmd = [
        sys.executable, "-m", "lm_eval", "run", "--model", "hf",
        "--model_args", f"pretrained={model_dir},dtype=float32", "--device", "cpu", "--batch_size", "1",
        "--include_path", str(TASK_DIR), "--tasks", ",".join(tasks), "--limit", "3", "--log_samples",
        "--metadata", json.dumps({"data_dir": str(sample_data_dir)}), "--output_path", str(tmp_path / "out"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli = json.load(open(glob.glob(str(tmp_path / "out" / "*" / "results_*.json"))[0]))
    for task in tasks:
        for metric in ("acc,none", "acc_norm,none"):
            if metric in mem.raw["results"][task]:
                assert cli["results"][task][metric] == mem.raw["results"][task][metric], (task, metric)
        samples_file = glob.glob(str(tmp_path / "out" / "*" / f"samples_{task}_*"))[0]
        cli_samples = [json.loads(line) for line in open(samples_file)]
        mem_lls = [float(r[0]) for s in mem.raw["samples"][task] for r in s["filtered_resps"]]
        cli_lls = [float(r[0]) for s in cli_samples for r in s["filtered_resps"]]
        assert len(cli_lls) == len(mem_lls) >= 3 * 2
        assert cli_lls == pytest.approx(mem_lls, rel=1e-5, abs=1e-5)


def test_zero_shot_mean_stderr_against_numpy():
    """the 7-task mean's standard error = sqrt(sum se_i^2) / 7 (independent tasks)."""
    rng = np.random.default_rng(0)
    metrics = {}
    for t in PAPER_MEAN_TASKS:
        correct = rng.random(200) < rng.uniform(0.3, 0.7)
        metrics[t] = {"acc": float(correct.mean()), "acc_stderr": float(correct.std(ddof=1) / np.sqrt(200))}
    # independent: the standard deviation of the mean of 7 independent normals, by simulation
    draws = rng.normal([metrics[t]["acc"] for t in PAPER_MEAN_TASKS],
                       [metrics[t]["acc_stderr"] for t in PAPER_MEAN_TASKS], size=(200_000, 7)).mean(axis=1)
    assert zero_shot_mean_stderr(metrics) == pytest.approx(float(draws.std()), rel=0.01)
    del metrics["spp_rte"]["acc_stderr"]
    assert zero_shot_mean_stderr(metrics) is None


def test_the_model_comes_back_in_its_training_mode(sample_data_dir):
    """lm-eval's ``HFLM`` calls ``model.eval()`` when built; ``evaluate_tasks`` restores the mode the caller had."""
    from spp.models.tiny import tiny_llama, tiny_tokenizer

    model = tiny_llama(seed=0).train()
    evaluate_tasks(model, tiny_tokenizer(), [sorted(PAPER_MEAN_TASKS)[0]], limit=1, data_dir=sample_data_dir)
    assert model.training
