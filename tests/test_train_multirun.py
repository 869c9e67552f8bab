"""``python train.py -m adapter.r=4,8``: two jobs, two run directories, one pruning (the second hits the cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR

FAST = ["model=tiny", "debug=fast", "pruner=wanda", "sparsity=nm2_4", "eval=none", "dense_ppl=false",
        "pruned_ppl=false", f"data_dir={SAMPLE_DATA_DIR}"]


def _train(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_multirun_two_jobs_prune_once(tmp_path):
    sweep = tmp_path / "sweep"
    _train(["-m", "adapter.r=4,8", *FAST, f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}",
            "logger=[csv,wandb]"])
    runs = sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file())
    assert len(runs) == 2, list(sweep.iterdir())
    summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
    assert [s["run"]["r"] for s in summaries] == [4, 8]
    assert [s["pruning"]["cache_hit"] for s in summaries] == [False, True]
    # one cache entry (a directory); beside it may lie the ``<entry>.lock`` file the writer held while pruning
    entries = [p for p in (tmp_path / "cache" / "pruning").glob("*/*") if p.is_dir()]
    assert len(entries) == 1, entries
    for run, summary in zip(runs, summaries, strict=True):
        assert (run / "merged" / "model.safetensors.index.json").is_file()
        assert summary["sparsity"]["after"] == summary["sparsity"]["before"] == 0.5
        offline = list((run / "wandb").glob("offline-run-*"))
        assert len(offline) == 1, "each job is its own (offline) W&B run under its run dir"
    assert summaries[0]["params"]["trainable"] < summaries[1]["params"]["trainable"]
