"""A new user's first hour: ``--help`` explains each command's own groups and keys, a run whose stdout
is a file still reports progress during training, and ``eval.py`` names its output folder after what it evaluates.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spp.cli_help import attribute_docs, first_sentence, key_doc
from spp.paths import CONF_DIR, REPO_ROOT, SAMPLE_DATA_DIR
from spp.training.config import TrainerConfig, TrainJobConfig

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
ALL_GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")
# Written out here, not read from the configs: what each command is meant to compose.
USED = {
    "train.py": ["adapter", "budget", "calibration", "data", "debug", "eval", "experiment", "logger", "model",
                 "objective", "pruner", "reconstruct", "sparsity", "strategy", "trainer"],
    "eval.py": ["calibration", "eval", "logger", "model", "pruner", "reconstruct", "sparsity"],
    "prune.py": ["calibration", "model", "pruner", "reconstruct", "sparsity"],
}


def _run(args: list[str], cwd: Path = REPO_ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def _groups_section(text: str) -> dict[str, str]:
    """``{group: description}`` from the ``== Config groups`` section (a group line starts at column 2)."""
    section = text.split("== Config groups")[1].split("\n== ")[0]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^  (\w+) +(\S.*)$", section, re.M)}


@pytest.mark.parametrize("script", [pytest.param(s, marks=[] if s == "train.py" else pytest.mark.slow)
                                    for s in sorted(USED)])  # train.py in the default suite, the others slow
def test_help_lists_own_groups_with_descriptions(script: str) -> None:
    proc = _run([script, "--help"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = _groups_section(proc.stdout)
    assert sorted(groups) == USED[script], groups
    assert all(len(desc) > 20 for desc in groups.values()), groups
    ignored = set(ALL_GROUPS) - set(USED[script])
    assert not ignored & set(groups)
    assert "== Keys" in proc.stdout and "cache_dir" in proc.stdout
    # no config dump: Hydra's default help prints the whole composed config (150+ lines)
    assert "_target_" not in proc.stdout and len(proc.stdout.splitlines()) < 160


def test_help_key_lines_come_from_the_docstrings() -> None:
    docs = attribute_docs(TrainerConfig)
    assert docs["lr"] == "Peak learning rate (AdamW)."
    assert "progress_every_s" in docs and key_doc(TrainJobConfig, "trainer.lr") == docs["lr"]
    with pytest.raises(KeyError, match="trainer.no_such_key"):
        key_doc(TrainJobConfig, "trainer.no_such_key")
    assert first_sentence("SPP scaling s of Eq. 6 (authors: 2.0). More.") == "SPP scaling s of Eq. 6 (authors: 2.0)."


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory) -> tuple[Path, str]:
    """A tiny training run with stdout and stderr redirected to a file (not a TTY); its run dir and its log."""
    tmp = tmp_path_factory.mktemp("logged")
    log = tmp / "train.log"
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, "train.py", "experiment=tiny_smoke", "trainer.progress_every_s=0",
             f"run_dir={tmp / 'run'}", f"cache_dir={tmp / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}"],
            cwd=REPO_ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT, timeout=600,
        )
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    return tmp / "run", text


def test_redirected_run_logs_progress_during_training(logged_run) -> None:
    _, text = logged_run
    lines = text.splitlines()
    steps = [i for i, line in enumerate(lines) if re.search(r"progress\]\[INFO\] - step \d+/6 ", line)]
    done = next(i for i, line in enumerate(lines) if "training done: 6 optimiser steps" in line)
    assert len(steps) == 6 and max(steps) < done  # every step (progress_every_s=0), all before training ends
    assert re.search(r"step 6/6 \(100%\)  loss \d+\.\d{4}  [\d,]+ tokens/s  elapsed \S+  ETA 0s", text)
    # each phase says what it measured as it happens, in order
    order = ["dense perplexity:", "pruned: wanda nm2_4", "pruned perplexity:", "fit phase:", "training done:",
             "finalize][INFO] - merged model exported to", "merged perplexity (wikitext2):"]
    where = [next(i for i, line in enumerate(lines) if key in line) for key in order]
    assert where == sorted(where), dict(zip(order, where, strict=True))
    # no config tree by default, no Lightning boilerplate, no redrawn bars
    for noise in ("GPU available", "TPU available", "litlogger", "`Trainer(", "flops_per_batch", "LeafSpec", "\r",
                  "┣━━"):
        assert noise not in text, noise
    # the output paths are printed whole, one per line, under the table
    run = str(logged_run[0])
    assert f"merged model: {run}/merged" in lines and f"summary: {run}/summary.json" in lines


def test_one_checkpoint_file_per_step_and_no_duplicate_audit(logged_run) -> None:
    run, _ = logged_run
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["adapter-step000006.ckpt", "last.ckpt"]
    assert (run / "checkpoints" / "last.ckpt").is_symlink()
    audits = json.loads((run / "summary.json").read_text())["sparsity"]["audits"]
    steps = [(a["step"]) for a in audits if a["when"] != "merged"]
    assert len(steps) == len(set(steps)), audits


@pytest.mark.slow  # an eval.py process on the export (13 s); CI runs it
def test_eval_of_exported_spp_model_is_named_after_its_method(logged_run, tmp_path) -> None:
    run, _ = logged_run
    proc = _run([str(REPO_ROOT / "eval.py"), f"model.path={run / 'merged'}", "model=tiny", "eval.seqlen=64",
                 "eval.max_windows=2", "eval.tasks=[]", f"data_dir={SAMPLE_DATA_DIR}",
                 f"cache_dir={tmp_path / 'cache'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = list((tmp_path / "outputs" / "eval").rglob("results.json"))
    assert len(results) == 1
    assert results[0].parent.parent.relative_to(tmp_path / "outputs" / "eval") == Path("tiny/wanda-nm2_4/spp-r16")
