"""One job per run directory.

Two ``train.py`` processes on one ``run_dir``: the second is refused in one line (exit 2) naming the run directory
and the first job's pid, before it loads a model or removes any temporary, and the first finishes with a run
folder that describes it alone. The ranks of one job (Lightning re-runs the script with ``LOCAL_RANK`` set) do not
refuse each other: only the leader takes the lock (``tests/test_train_distributed.py`` runs such a job).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from spp.errors import UserError
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from spp.run_lock import LOCK_FILE, hold_run_dir, is_job_leader

HOLD = """
import os, time
import spp.models.loading as loading

_load = loading.load_model

def held_load(*args, **kwargs):
    # keep the job alive (holding its run directory) until the test creates the release file
    release = os.environ["SPP_TEST_RELEASE"]
    open(release + ".held", "w").close()
    deadline = time.time() + 300
    while not os.path.exists(release) and time.time() < deadline:
        time.sleep(0.2)
    return _load(*args, **kwargs)

if os.environ.get("SPP_TEST_RELEASE"):
    loading.load_model = held_load
"""


def _train(run: Path, tmp: Path, seed: int, env: dict[str, str]) -> list[str]:
    return [sys.executable, "train.py", "experiment=tiny_smoke", "trainer.progress_bar=none",
            "guards.loss_must_fall=false", f"seed={seed}", f"run_dir={run}", f"cache_dir={tmp / 'cache'}",
            f"data_dir={SAMPLE_DATA_DIR}", f"hydra.run.dir={tmp / f'hydra{seed}'}"]


def _wait_until_held(marker: Path, first: subprocess.Popen, timeout: float = 180.0) -> None:
    """Wait until the first job is about to load its model (it then stays there until released)."""
    deadline = time.time() + timeout
    while not marker.exists():
        assert first.poll() is None, first.communicate()
        assert time.time() < deadline, "the first job never reached its model load"
        time.sleep(0.2)


@pytest.mark.slow  # two train.py processes (37 s loaded); the lock itself is tested in-process below; CI runs it
def test_second_job_on_the_same_run_dir_is_refused_and_the_first_is_untouched(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(HOLD))
    release = tmp_path / "release"
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")])}
    run = tmp_path / "run"
    first = subprocess.Popen(_train(run, tmp_path, 1, env), cwd=REPO_ROOT, env={**env, "SPP_TEST_RELEASE":
                             str(release)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_held(tmp_path / "release.held", first)
        assert json.loads((run / LOCK_FILE).read_text())["pid"] == first.pid
        export = run / ".merged.inprogress"  # what the first job's export would look like while it writes
        export.mkdir()
        second = subprocess.run(_train(run, tmp_path, 2, env), cwd=REPO_ROOT, env=env, capture_output=True,
                                text=True, timeout=300)
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-3000:]
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
        assert lines[0].startswith("train.py: error: run_dir=") and str(run) in lines[0], lines[0]
        assert f"pid {first.pid}" in lines[0] and "another run_dir=" in lines[0], lines[0]
        assert export.is_dir()  # the refused job removed nothing of the first one's
        export.rmdir()
        assert "loading model" not in second.stdout + second.stderr
    finally:
        release.touch()
        out, err = first.communicate(timeout=600)
    assert first.returncode == 0, out[-2000:] + err[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["seed"] == 1
    assert yaml.safe_load((run / "resolved_config.yaml").read_text())["seed"] == 1
    assert (run / "merged" / "model.safetensors.index.json").is_file()
    with (run / "csv" / "metrics.csv").open() as fh:  # one job's logger wrote it: its steps, once each
        losses = [float(row["train/loss"]) for row in csv.DictReader(fh) if row.get("train/loss")]
    assert losses == pytest.approx(summary["losses"]["train"], rel=1e-5)


def test_lock_is_exclusive_released_and_skipped_by_other_ranks(tmp_path):
    with hold_run_dir(tmp_path / "run") as run:
        assert json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()
        with pytest.raises(UserError, match=f"pid {os.getpid()} on host") as exc:
            with hold_run_dir(run):
                pass
        assert exc.value.key == "run_dir"
        with pytest.MonkeyPatch.context() as mp:  # another rank of the same job
            mp.setenv("RANK", "1")
            with hold_run_dir(run):
                pass
    with hold_run_dir(tmp_path / "run", "run_dir"):  # released when the job ended
        pass


@pytest.mark.parametrize("env, leader", [
    ({}, True), ({"LOCAL_RANK": "0", "NODE_RANK": "0"}, True), ({"LOCAL_RANK": "1"}, False), ({"RANK": "3"}, False),
    ({"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"}, True), ({"NODE_RANK": "1"}, False),
    ({"SLURM_PROCID": "2"}, False),
])
def test_only_the_jobs_leader_takes_the_lock(env, leader, monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert is_job_leader() is leader


def test_lock_file_of_another_user_still_locks(tmp_path, monkeypatch):
    """In a shared run directory the lock file may belong to someone else (0644): it is opened read-only, and
    the flock still keeps a second job out."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_FILE).write_text("")
    real_open = os.open

    def not_ours(path, flags, *args):
        if str(path).endswith(LOCK_FILE) and flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", not_ours)
    with hold_run_dir(tmp_path / "run"):
        monkeypatch.setattr(os, "open", real_open)
        with pytest.raises(UserError, match="in use by another job"):
            with hold_run_dir(tmp_path / "run"):
                pass
