"""Committed JSON records name no machine's absolute paths (``python -m lab.record_paths``).

The older records (written before the recovery study's runner relativized its jobs, :mod:`lab.recovery.provenance`)
name the checkouts, data roots, caches and scratch directories of the machines they ran on. Each such prefix is
rewritten, as text inside the JSON strings, relative to the repository (``experiments/...``, ``.``), to the shared
data root (``../shared/data``) or as the variable a reader sets (``$SPP_CACHE_DIR``, ``$RUN_DIR``); no number
changes. :func:`committed_with_paths` is the check: ``git grep -lE '"/(work|tmp|root|home)/' -- '*.json'``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from spp.atomic import write_file_atomic
from spp.paths import REPO_ROOT

PATTERN = '"/(work|tmp|root|home)/'
"""What the check looks for: a JSON string that starts with a machine's absolute path."""

PREFIXES: tuple[tuple[str, str], ...] = (
    ("/work/main/", ""), ("/work/main", "."),  # the checkout the older jobs ran in (a prefix, then the whole path)
    ("/work/shared/data", "../shared/data"), ("/work/shared", "../shared"),  # the shared root beside it
    ("/tmp/fresh_cache", "$SPP_CACHE_DIR"), ("/root/.cache/spp", "$SPP_CACHE_DIR"), ("/tmp/g/cache", "$SPP_CACHE_DIR"),
    ("/tmp/clone19/", ""), ("/tmp/clone19", "."), ("/tmp/fresh/", ""), ("/tmp/fresh", "."),  # fresh clones
    ("/tmp/exp2/", ""), ("/tmp/exp2", "."), ("/tmp/exp/", ""), ("/tmp/exp", "."),  # checkouts (their cwd)
    ("/tmp/drop0", "$RUN_DIR"),  # a run directory outside the repository (the run's files are the record itself)
    ("/tmp/m24", "$MODEL_DIR"),  # a model directory on the GPU machine
)
"""``(absolute prefix, what it becomes)``, each applied in this order: a longer prefix before one it starts with,
``/x/`` before the whole path ``/x``."""


def committed_with_paths(root: Path = REPO_ROOT) -> list[str]:
    """The committed JSON files with a string that starts with a machine's absolute path (``git grep``)."""
    proc = subprocess.run(["git", "grep", "-lE", PATTERN, "--", "*.json"], cwd=root, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 1: nothing found
        raise RuntimeError(f"git grep failed in {root}: {proc.stderr.strip()}; run it inside the git checkout")
    return proc.stdout.split()


def rewrite_text(text: str) -> str:
    """``text`` with every prefix of :data:`PREFIXES` rewritten."""
    for old, new in PREFIXES:
        text = text.replace(old, new)
    return text


TEXT_SUFFIXES = (".yaml", ".log")
"""The run directories' other text records (resolved configs, logs), rewritten the same way."""


def committed_run_texts(root: Path = REPO_ROOT) -> list[str]:
    """The committed JSON files, and configs and logs under ``experiments/results/runs``, that name a prefix of
    :data:`PREFIXES` anywhere (a command line inside a string, too)."""
    args = ["git", "grep", "-lF", *(x for old, _ in PREFIXES for x in ("-e", old.strip('"'))), "--",
            "*.json", *(f"experiments/results/runs/*{suffix}" for suffix in TEXT_SUFFIXES)]
    proc = subprocess.run(args, cwd=root, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"git grep failed in {root}: {proc.stderr.strip()}; run it inside the git checkout")
    return proc.stdout.split()


def rewrite(path: Path) -> bool:
    """Rewrite ``path`` (atomically) when it names a prefix; whether it changed.

    Raises:
        ValueError: a rewritten JSON file is no longer the same JSON apart from its strings.
    """
    raw = path.read_bytes()  # bytes: logs keep their carriage returns
    text = raw.decode("utf-8", errors="surrogateescape")
    new = rewrite_text(text)
    if new == text:
        return False
    if path.suffix == ".json" and _numbers(json.loads(new)) != _numbers(json.loads(text)):
        raise ValueError(f"{path}: rewriting its paths changed a number; fix PREFIXES in lab/record_paths.py")
    data = new.encode("utf-8", errors="surrogateescape")
    write_file_atomic(path, lambda tmp: tmp.write_bytes(data))
    return True


def _numbers(value: object) -> list[object]:
    """Every non-string leaf of a JSON value, in order (what a path rewrite must leave unchanged)."""
    if isinstance(value, dict):
        return [x for k in value for x in _numbers(value[k])]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [] if isinstance(value, str) else [value]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.record_paths", description=__doc__)
    p.add_argument("--check", action="store_true", help="only list the files that still name a machine path")
    args = p.parse_args(argv)
    files = committed_with_paths()
    if not args.check:
        for f in [*files, *committed_run_texts()]:
            rewrite(REPO_ROOT / f)
        files = committed_with_paths()
    for f in files:
        print(f"{f}: names a machine's absolute path; add its prefix to PREFIXES in lab/record_paths.py",
              file=sys.stderr)
    return 1 if files else 0


if __name__ == "__main__":
    sys.exit(main())
