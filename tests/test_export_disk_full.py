"""A full disk at export time is one line (exit 2) naming the path, the bytes needed and free and
the fix, and ``summary.json`` is still written, with ``"status": "export_failed"``; nothing half-written is left,
the adapter files stay. The merged model is then not evaluated: evaluation reads the export.

Two ways the disk is full: too little free space before the export (refused before anything is written), and
the disk filling up while a shard is written (safetensors raises ``SafetensorError ... No space left on device``,
the error seen on a real full disk).
"""

from __future__ import annotations

import errno
import importlib
import json
import shutil
import sys
from collections import namedtuple
from pathlib import Path

import pytest
from safetensors import SafetensorError
from train_helpers import tiny_job

import spp.export.merged as merged_module
from spp.adapters.registry import apply_adapter, get_method
from spp.atomic import is_disk_full
from spp.distributed import DistContext
from spp.errors import UserError
from spp.export.manifest import ExportManifest
from spp.models.tiny import tiny_llama
from spp.paths import CONF_DIR, SAMPLE_DATA_DIR
from train import run_job

Usage = namedtuple("Usage", "total used free")
ENOSPC_TEXT = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'


def little_space_for_big_files(monkeypatch, free: int = 300_000) -> None:
    """``shutil.disk_usage`` reports ``free`` bytes: the tiny merged model (~0.5 MB + slack) does not fit."""
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: Usage(10**9, 10**9 - free, free))


def assert_export_failed(run: Path) -> dict:
    """summary.json says export_failed; no merged model, no temporary; the adapter files stay."""
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "export_failed", summary["status"]
    assert "export.merged=false" in summary["outputs"]["export_error"]
    assert summary["outputs"]["merged_dir"] is None
    assert not (run / "merged").exists() and not list(run.glob(".merged.*"))
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    return summary


def test_too_little_space_is_refused_before_writing_in_one_line(tmp_path, monkeypatch, capsys):
    little_space_for_big_files(monkeypatch)
    module = importlib.import_module("train")
    monkeypatch.setattr(sys, "argv", ["train.py", f"--config-path={CONF_DIR}", "model=tiny", "debug=fast",
                                      f"data_dir={SAMPLE_DATA_DIR}", f"run_dir={tmp_path / 'run'}",
                                      f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'hydra'}",
                                      "hydra.output_subdir=null", "print_config=false"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        module.main()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line.lower()]  # (progress bars aside)
    assert exc.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert err.strip().endswith(line), err
    assert line.startswith("train.py: error: not enough disk space to export the merged model to "), line
    assert str(tmp_path / "run" / "merged") in line and "needs about" in line and "293.0 KiB free" in line, line
    assert "run_dir=" in line and "export.merged=false" in line, line
    assert_export_failed(tmp_path / "run")


def test_disk_filling_up_while_writing_keeps_nothing_half_written(tmp_path, monkeypatch):
    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 1000)  # what was written before it filled
        raise SafetensorError(ENOSPC_TEXT)

    monkeypatch.setattr(merged_module, "save_file", full)
    with pytest.raises(UserError) as exc:
        run_job(tiny_job(tmp_path))
    assert exc.value.key == "export.merged" and exc.value.path == str(tmp_path / "run" / "merged")
    assert "the disk filled up while exporting the merged model" in str(exc.value)
    assert "No space left on device" in str(exc.value) and "free now" in str(exc.value)
    summary = assert_export_failed(tmp_path / "run")
    assert summary["perplexity"]["pruned"] is not None  # what was measured is reported
    assert summary["perplexity"]["merged"] is None  # evaluation reads the export: nothing to read


def test_disk_full_errors_are_recognised():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(SafetensorError(ENOSPC_TEXT))
    try:
        try:
            raise OSError(errno.ENOSPC, "x")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("shape mismatch"))


def test_free_space_estimate_covers_the_written_model(tmp_path, tiny_tok):
    """The estimate (tensors + 1 % + slack) is at least what the export really writes."""
    job = tiny_job(tmp_path)
    model, _ = apply_adapter(tiny_llama(seed=0), job.adapter, None)
    manifest = ExportManifest(adapter={"name": job.adapter.name}, dtype="torch.float32", pruning={})
    inputs = merged_module.ExportInputs(get_method(job.adapter.name), None, tiny_tok, manifest)
    written = merged_module.export_streamed(model, inputs, tmp_path / "merged", DistContext()).path
    size = sum(f.stat().st_size for f in written.rglob("*") if f.is_file())
    weights = sum(f.stat().st_size for f in written.glob("*.safetensors"))
    needed = merged_module.needed_bytes(model)
    assert size <= needed <= weights * 1.2 + merged_module.EXPORT_SLACK_BYTES
