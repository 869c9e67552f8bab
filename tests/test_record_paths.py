"""No committed JSON record names a machine's absolute path: the check is ``git grep`` itself, run on this checkout
and, as a negative control, on a scratch repository that commits one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from lab.record_paths import committed_with_paths, rewrite

ROOT = Path(__file__).resolve().parents[1]


def test_no_committed_json_names_a_machine_path():
    assert committed_with_paths(ROOT) == [], "run: python -m lab.record_paths"


def test_the_check_finds_a_committed_absolute_path(tmp_path: Path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "ok.json").write_text(json.dumps({"run_dir": "experiments/results/runs/x"}))
    (tmp_path / "bad.json").write_text(json.dumps({"run_dir": "/work/main/experiments/results/runs/x"}))
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    assert committed_with_paths(tmp_path) == ["bad.json"]


def test_rewrite_makes_paths_relative_and_keeps_numbers_and_bytes(tmp_path: Path):
    record = {"run_dir": "/work/main/experiments/results/runs/a", "repo": "/work/main", "ppl": 93.89123456789,
              "data": ["/work/shared/data/c4/c4_sample.jsonl", "/tmp/exp/data/alpaca/a.json"],
              "cache_dir": "/root/.cache/spp", "steps": 63}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(record, indent=1))
    assert rewrite(path)
    out = json.loads(path.read_text())
    assert out == {**record, "run_dir": "experiments/results/runs/a", "repo": ".", "cache_dir": "$SPP_CACHE_DIR",
                   "data": ["../shared/data/c4/c4_sample.jsonl", "data/alpaca/a.json"]}
    assert not rewrite(path)  # nothing left to rewrite
    log = tmp_path / "train.log"
    log.write_bytes(b"step 1\r step 2\r\n/tmp/exp/spp/eval/tasks/boolq.yaml\n")
    assert rewrite(log) and log.read_bytes() == b"step 1\r step 2\r\nspp/eval/tasks/boolq.yaml\n"
