"""One evaluation for ``train.py`` and ``eval.py``: the merged model a training run exported
scores the same numbers when ``eval.py`` evaluates the folder, both through ``spp.eval.evaluate.evaluate``; and
``eval.py`` on 2 processes started by ``torchrun`` (perplexity windows and lm-eval documents split over them)
gives the numbers of one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import tiny_job

import spp.eval.evaluate as evaluate_module
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from train import run_job

EVAL = ["eval.seqlen=64", "eval.max_windows=5", "eval.batch_size=1", "eval.window_sampling=systematic",
        "eval.tasks=[spp_boolq,spp_arc_easy]", "eval.limit=7", "eval.lm_eval_batch_size=1"]


def _eval_py(tmp: Path, merged: Path, name: str, nproc: int = 1) -> dict:
    """``eval.py model.path=<merged>`` (under ``torchrun`` with ``nproc`` > 1); its ``results.json`` record."""
    out = tmp / name
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "offline", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, *launcher, "eval.py", "model=tiny", f"model.path={merged}", *EVAL,
                           f"data_dir={SAMPLE_DATA_DIR}", f"run_dir={out}", "accelerator=cpu",
                           f"hydra.run.dir={tmp / ('hydra-' + name)}", "logger=csv"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads((out / "results.json").read_text())["records"][0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny training run whose finalize evaluates its export on the EVAL settings (calls counted)."""
    tmp = tmp_path_factory.mktemp("one-evaluate")
    calls = []
    real = evaluate_module.evaluate

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    mp = pytest.MonkeyPatch()
    import spp.training.finalize as finalize_module

    mp.setattr(finalize_module, "evaluate", counted)
    try:
        summary = run_job(tiny_job(tmp, *EVAL))
    finally:
        mp.undo()
    return tmp, summary, calls


def test_eval_py_scores_train_py_export_with_the_same_numbers(trained):
    tmp, summary, calls = trained
    merged = Path(summary["outputs"]["merged_dir"])
    assert calls == [merged]  # finalize evaluated the folder it exported
    record = _eval_py(tmp, merged, "eval-1")
    ours, theirs = summary["perplexity"]["merged"], record["ppl"]["wikitext2"]
    assert theirs["window_nll"] == ours["window_nll"] and theirs["ppl"] == ours["ppl"]
    assert record["tasks"] == summary["zero_shot"]["metrics"]
    assert record["info"]["evaluation"]["placement"]["how"] == "single"
    assert record["info"]["linear_sparsity"] == pytest.approx(0.5, abs=1e-3)  # from its spp_export.json audit


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_eval_py_on_two_processes_gives_the_one_process_numbers(trained):
    tmp, summary, _ = trained
    merged = Path(summary["outputs"]["merged_dir"])
    two = _eval_py(tmp, merged, "eval-2", nproc=2)
    ours = summary["perplexity"]["merged"]
    nll = two["ppl"]["wikitext2"]["window_nll"]
    assert len(nll) == len(ours["window_nll"])
    assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(nll, ours["window_nll"], strict=True))
    assert two["ppl"]["wikitext2"]["ppl"] == pytest.approx(ours["ppl"], rel=1e-6)
    one = summary["zero_shot"]["metrics"]  # lm-eval batch 1: the same log-likelihoods, so the same answers
    assert sorted(two["tasks"]) == sorted(one)
    for task, row in one.items():  # the stderr is summed in another order from the gathered documents
        assert {k: v for k, v in two["tasks"][task].items() if "stderr" not in k} == \
            {k: v for k, v in row.items() if "stderr" not in k}
        assert all(two["tasks"][task][k] == pytest.approx(v, rel=1e-12) for k, v in row.items() if "stderr" in k)
    placement = two["info"]["evaluation"]["placement"]
    assert (placement["replicas"], placement["how"], placement["world"]) == (2, "data_parallel", 2)
