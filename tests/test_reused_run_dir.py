"""A ``run_dir`` reused by a new run: the previous run's export never stays beside the new run's files when the new
export fails, so nothing of the old run loads as if it were the new one's."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from train_helpers import tiny_job

from spp.errors import UserError
from spp.export.manifest import ExportManifest
from train import run_job

Usage = namedtuple("Usage", "total used free")


def test_failed_export_leaves_no_previous_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run 1 (r=16) exports ``merged/``; run 2 (r=8, same run_dir) finds too little disk space: its summary says
    ``export_failed``, its adapter is r=8, and no ``merged/`` (the r=16 one) is left to load."""
    run = tmp_path / "run"
    run_job(tiny_job(tmp_path, "adapter.r=16", "eval=none"))
    assert ExportManifest.read(run / "merged") is not None  # negative control: run 1's export is there
    assert json.loads((run / "adapter" / "adapter_config.json").read_text())["layer_kwargs"]["r"] == 16
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(UserError, match="not enough disk space to export"):
        run_job(tiny_job(tmp_path, "adapter.r=8", "eval=none"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "export_failed"
    assert json.loads((run / "adapter" / "adapter_config.json").read_text())["layer_kwargs"]["r"] == 8
    assert not (run / "merged").exists() and not list(run.glob(".merged.*"))


def test_run_without_export_leaves_no_previous_export(tmp_path: Path) -> None:
    """Run 1 exports ``merged/`` (and a diverged run's folder is left beside it); run 2 in the same run_dir with
    ``export.merged=false``: neither of run 1's folders is left to load as run 2's model."""
    run = tmp_path / "run"
    run_job(tiny_job(tmp_path, "adapter.r=16", "eval=none"))
    (run / "merged.diverged").mkdir()  # what an earlier diverged run in this run_dir left
    assert ExportManifest.read(run / "merged") is not None  # negative control: run 1's export is there
    run_job(tiny_job(tmp_path, "adapter.r=8", "eval=none", "export.merged=false"))
    assert json.loads((run / "adapter" / "adapter_config.json").read_text())["layer_kwargs"]["r"] == 8
    assert not (run / "merged").exists() and not (run / "merged.diverged").exists()
