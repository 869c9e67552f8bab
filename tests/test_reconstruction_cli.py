"""``reconstruct=blockwise`` from the command line on the tiny model.

Refusals (the preflight, :mod:`spp.preflight.reconstruction`, before any weight is read): an unknown form, ``none``,
a form option the form lacks, ``reconstruct.seqlen`` beyond the model's positions, a calibration file that is not
there: exit 2, one line naming the key, nothing pruned. End to end: ``train.py`` (reconstruct, then train),
``train.py trainer.max_steps=0`` (reconstruct only; export, reload, every pruned weight zero) and ``prune.py``, with
``summary.json``'s ``reconstruction`` and the CSV logger's ``final/reconstruct_loss_end_mean``.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_runner import run_cases

from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR

RECON = ["reconstruct=blockwise", "reconstruct.nsamples=4", "reconstruct.seqlen=128"]


def _env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1",
           "SPP_CACHE_DIR": str(tmp / "cache")}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


# -- refusals ----------------------------------------------------------------------------------------------------------

REFUSALS: dict[str, tuple[list[str], str, list[str]]] = {
    # case: (overrides, the key the line names, more words it holds)
    "form_unknown": (["reconstruct.form=bogus"], "reconstruct.form", ["'bogus'"]),
    "form_none": (["reconstruct.form=none"], "reconstruct.form", ["trains nothing"]),
    "form_option": (["+reconstruct.form_options.bogus=3"], "reconstruct.form_options", ["bogus"]),
    "seqlen": (["reconstruct.seqlen=1024"], "reconstruct.seqlen", ["max_position_embeddings=512"]),
    "file_missing": (["reconstruct.path=/nonexistent/c4.json"], "reconstruct.path", ["/nonexistent/c4.json"]),
    "source_missing": (["reconstruct.source=/nonexistent/corpus.jsonl"], "reconstruct.source",
                       ["/nonexistent/corpus.jsonl"]),
    "too_few_windows": (["reconstruct.nsamples=100000"], "reconstruct.nsamples", ["reconstruct.seqlen=128"]),
    "form_shape": (["+reconstruct.form_options.r=7"], "reconstruct.form_options.r", ["7"]),
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, Any]:
    """Each refusal through ``train.py`` and ``prune.py`` (``{<cmd>_<case>: (exit status, stderr)}``); ``tmp``."""
    tmp = tmp_path_factory.mktemp("recon_refusals")
    cases: dict[str, list[str]] = {}
    for name, (overrides, _, _) in REFUSALS.items():
        data = [f"data_dir={SAMPLE_DATA_DIR}"]
        cases[f"train_{name}"] = ["train.py", "experiment=tiny_smoke", *RECON, *overrides, *data,
                                  f"hydra.run.dir={tmp / 'train' / name}",
                                  f"cache_dir={tmp / 'cache' / f'train_{name}'}"]
        cases[f"prune_{name}"] = ["prune.py", "model=tiny", "calibration=quick", "calibration.seqlen=128", *RECON,
                                  *overrides, *data, f"run_dir={tmp / 'prune' / name}",
                                  f"hydra.run.dir={tmp / 'hprune' / name}",
                                  f"cache_dir={tmp / 'cache' / f'prune_{name}'}"]
    cases["prune_off"] = ["prune.py", "model=tiny", "calibration=quick", "calibration.seqlen=128", "reconstruct=none",
                          "reconstruct.form=bogus", "reconstruct.seqlen=1024", f"data_dir={SAMPLE_DATA_DIR}",
                          f"run_dir={tmp / 'prune' / 'off'}", f"hydra.run.dir={tmp / 'hprune' / 'off'}",
                          f"cache_dir={tmp / 'cache' / 'prune_off'}"]
    proc, found = run_cases(cases, _env(tmp), REPO_ROOT, 600)
    assert proc.returncode == 0 and set(cases) <= set(found), proc.stderr[-5000:]
    return {"tmp": tmp, **found}


@pytest.mark.parametrize("cmd", ["train", "prune"])
@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_in_one_line_before_any_work(refusals, cmd, case):
    code, err = refusals[f"{cmd}_{case}"]
    _, key, words = REFUSALS[case]
    assert code == 2, (code, err[-3000:])
    assert "Traceback" not in err and "TRIPWIRE" not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err  # no pruning progress either: it stopped before the model was pruned
    assert lines[0].startswith(f"{cmd}.py: error: ") and " — " in lines[0], lines[0]
    assert f"{key}" in lines[0] and all(w in lines[0] for w in words), lines[0]
    tmp = refusals["tmp"]
    assert not list((tmp / "cache" / f"{cmd}_{case}").glob("**/manifest.json")), "something was pruned and cached"
    assert not list(tmp.glob(f"*/{case}/**/summary.json")) and not list(tmp.glob(f"*/{case}/**/*.safetensors"))



def test_reconstruct_none_checks_nothing_of_it(refusals):
    """The negative control: with ``reconstruct=none`` its other keys are not read (the job prunes and writes)."""
    code, err = refusals["prune_off"]
    assert code == 0, err[-3000:]
    assert (refusals["tmp"] / "prune" / "off" / "mask_summary.json").is_file()
    assert not (refusals["tmp"] / "prune" / "off" / "reconstruction.json").exists()


# -- end to end --------------------------------------------------------------------------------------------------------

def run(tmp: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python <argv>`` from the repository root (its own cache under ``tmp``, the in-repo sample data)."""
    proc = subprocess.run([sys.executable, *argv, f"data_dir={SAMPLE_DATA_DIR}", f"cache_dir={tmp / 'cache'}"],
                          cwd=REPO_ROOT, env=_env(tmp), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def assert_pruned_zero(folder: Path) -> int:
    """Reload ``folder`` with ``AutoModelForCausalLM``: every decoder projection is 2:4 (each group of 4 consecutive
    inputs holds at least 2 exact zeros: the pruned weights); returns the projections checked."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    checked = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.startswith("model.layers."):
            zeros = (module.weight.detach() == 0).reshape(module.weight.shape[0], -1, 4).sum(-1)
            assert bool((zeros >= 2).all()), f"{name}: a pruned weight is not zero"
            assert float((module.weight != 0).float().mean()) > 0.45, f"{name}: more than the pruned are zero"
            checked += 1
    return checked


def check_record(record: dict[str, Any], steps: int) -> None:
    """Two blocks, each with finite positive start and end losses and ``steps`` steps; the means are theirs."""
    blocks = record["blocks"]
    assert [b["block"] for b in blocks] == [0, 1] and all(b["steps"] == steps for b in blocks), blocks
    assert all(0 < b["loss_end"] < float("inf") and 0 < b["loss_start"] < float("inf") for b in blocks), blocks
    assert record["loss_end_mean"] == pytest.approx(sum(b["loss_end"] for b in blocks) / 2, rel=1e-12)
    assert record["loss_start_mean"] == pytest.approx(sum(b["loss_start"] for b in blocks) / 2, rel=1e-12)


def test_prune_py_reconstructs(tmp_path):
    out = tmp_path / "out"
    proc = run(tmp_path, "prune.py", "model=tiny", "calibration=quick", "calibration.seqlen=128", *RECON,
               "reconstruct.lr=1e-2", f"run_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}")
    assert "reconstruction (spp): 2 blocks" in proc.stdout and "cache miss" in proc.stdout
    record = json.loads((out / "reconstruction.json").read_text())
    check_record(record, steps=3)  # 3 epochs x ceil(4 windows / 4 a step)
    assert all(b["loss_end"] < b["loss_start"] for b in record["blocks"]), record["blocks"]
    assert not record["cache_hit"] and "-blockwise-" in record["cache_path"]
    assert assert_pruned_zero(out / "model") == 14


@pytest.mark.slow
def test_train_py_reconstruct_only_exports_and_records(tmp_path):
    run_dir = tmp_path / "run"
    run(tmp_path, "train.py", "experiment=tiny_smoke", "reconstruct=blockwise", "trainer.max_steps=0",
        "reconstruct.lr=1e-2", "logger=csv", f"run_dir={run_dir}")
    summary = json.loads((run_dir / "summary.json").read_text())
    check_record(summary["reconstruction"], steps=3)
    ppl = summary["perplexity"]
    assert {"dense", "pruned", "reconstructed", "merged"} <= set(ppl) and ppl["reconstructed"]["ppl"] > 0
    # nothing trained after the reconstruction: the merged model is the reconstructed one
    assert ppl["merged"]["ppl"] == pytest.approx(ppl["reconstructed"]["ppl"], rel=1e-5)
    assert assert_pruned_zero(run_dir / "merged") == 14
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    logged = [float(r["final/reconstruct_loss_end_mean"]) for r in rows if r.get("final/reconstruct_loss_end_mean")]
    assert logged == [pytest.approx(summary["reconstruction"]["loss_end_mean"], rel=1e-6)]


@pytest.mark.slow
def test_train_py_reconstructs_then_trains(tmp_path):
    run_dir = tmp_path / "run"
    run(tmp_path, "train.py", "experiment=tiny_smoke", "reconstruct=blockwise", "logger=csv", f"run_dir={run_dir}")
    summary = json.loads((run_dir / "summary.json").read_text())
    check_record(summary["reconstruction"], steps=3)
    assert {"pruned", "reconstructed", "merged"} <= set(summary["perplexity"])
    assert assert_pruned_zero(run_dir / "merged") == 14
