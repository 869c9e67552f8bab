"""W&B for real, offline: a resumed job (``trainer.resume_from``) continues the interrupted job's W&B run (same run
id, read from the offline run folders ``<run_dir>/wandb/offline-run-<time>-<id>``) instead of starting a second
run of the same name; a fresh job still gets a run of its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from train_helpers import tiny_job

from spp.loggers import WANDB_RUN_FILE, recorded_wandb_run
from train import run_job

OFFLINE_RUN = re.compile(r"offline-run-\d{8}_\d{6}-(\w+)$")


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B offline, its config / cache / staging folders in a temporary directory."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))


def run_ids(run_dir: Path) -> list[str]:
    """The W&B run id of each offline run folder under ``<run_dir>/wandb``, oldest first."""
    folders = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*") if p.is_dir())
    return [OFFLINE_RUN.match(name).group(1) for name in folders]


def test_resumed_job_continues_the_interrupted_w_and_b_run(wandb_offline, tmp_path):
    common = ["logger=[csv,wandb]", "eval=none", "export.merged=false", "sample.enabled=false",
              "trainer.checkpoint_every_n_steps=2", "trainer.save_top_k=-1"]
    run_job(tiny_job(tmp_path, *common, "trainer.max_steps=4"))
    run = tmp_path / "run"
    (first,) = run_ids(run)
    checkpoint = run / "checkpoints" / "adapter-step000002.ckpt"  # as if preempted after step 2
    assert checkpoint.is_file(), sorted((run / "checkpoints").iterdir())
    run_job(tiny_job(tmp_path, *common, "trainer.max_steps=4", f"trainer.resume_from={checkpoint}"))
    assert run_ids(run) == [first, first]  # a second offline folder of the same run: `wandb sync` appends to it
    run_job(tiny_job(tmp_path, *common, "trainer.max_steps=6", "trainer.resume_from=last"))  # the printed resume
    assert run_ids(run) == [first, first, first]
    # negative control: a fresh job (no trainer.resume_from) starts a W&B run of its own
    run_job(tiny_job(tmp_path, *common, "trainer.max_steps=2", run="fresh"))
    (fresh,) = run_ids(tmp_path / "fresh")
    assert fresh != first


def test_recorded_run_id_is_read_from_the_checkpoint_run_folder(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    assert recorded_wandb_run(None) is None
    assert recorded_wandb_run(checkpoint) is None  # a run without W&B (or from before the record): a new W&B run
    (tmp_path / "run" / WANDB_RUN_FILE).write_text("{not json")
    assert recorded_wandb_run(checkpoint) is None
    (tmp_path / "run" / WANDB_RUN_FILE).write_text('{"id": "abc123xy", "project": "spp"}')
    assert recorded_wandb_run(checkpoint) == "abc123xy"
    assert recorded_wandb_run(tmp_path / "other" / "checkpoints" / "last.ckpt") is None  # another run's folder
