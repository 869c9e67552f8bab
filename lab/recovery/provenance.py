"""Committed run records name no machine's absolute paths: each finished job's text files are rewritten with the
checkout, the shared data root and the cache written relative before they are committed
(``python -m lab.recovery relativize experiments/results/runs/recovery``)."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

from spp.atomic import write_text_atomic
from spp.paths import REPO_ROOT, SHARED_DATA_DIR, default_cache_dir

TEXT_SUFFIXES = (".json", ".jsonl", ".yaml", ".log", ".md", ".csv")
SKIP_DIRS = ("adapter", "merged", "checkpoints", "wandb")
"""Large outputs that stay out of git (``experiments/results/.gitignore``) are left as they are."""


def replacements(cache_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """``(absolute prefix, what it becomes)``, longest first: the cache -> ``$SPP_CACHE_DIR``, the shared data ->
    ``../shared/data``, the checkout -> relative, the Python installation (warnings name its files) ->
    ``$SITE_PACKAGES`` / ``$PYTHON_PREFIX``."""
    cache = Path(cache_dir or default_cache_dir())
    pairs = [(str(cache), "$SPP_CACHE_DIR"), (str(SHARED_DATA_DIR), "../shared/data"), (f"{REPO_ROOT}/", ""),
             (str(REPO_ROOT), "."), (sysconfig.get_paths()["purelib"], "$SITE_PACKAGES"),
             (sys.base_prefix, "$PYTHON_PREFIX"), (sys.prefix, "$PYTHON_PREFIX")]
    return sorted(pairs, key=lambda p: -len(p[0]))


def relativize_file(path: Path, pairs: list[tuple[str, str]]) -> bool:
    """Rewrite ``path`` (atomically) when it names one of the prefixes; whether it changed."""
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    new = text
    for old, repl in pairs:
        new = new.replace(old, repl)
    if new == text:
        return False
    write_text_atomic(path, new)
    return True


def relativize(root: str | Path, cache_dir: str | Path | None = None) -> list[Path]:
    """Every text file of every finished job (a directory with ``summary.json`` or ``results.json``) below
    ``root``; returns the files rewritten."""
    pairs = replacements(cache_dir)
    changed = []
    finished = {p.parent for name in ("summary.json", "results.json") for p in Path(root).rglob(name)}
    for job in sorted(finished):
        for path in sorted(job.rglob("*")):
            rel = path.relative_to(job).parts
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not (set(rel[:-1]) & set(SKIP_DIRS)) \
                    and relativize_file(path, pairs):
                changed.append(path)
    return changed


def machine_record(load_start: float | None) -> dict[str, object]:
    """What a job ran on: CPU model, torch's CPU capability (``AVX512``, ``AVX2``: float32 results differ in the 4th
    digit between them), cores, threads, the 1-minute load average when the job started and now."""
    import torch

    model = "?"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), "?")
    threads = os.environ.get("OMP_NUM_THREADS")
    return {"cpu_model": model, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cores": os.cpu_count(),
            "omp_num_threads": int(threads) if threads else None, "torch": torch.__version__,
            "load_1m_start": load_start, "load_1m_end": round(os.getloadavg()[0], 2)}


def write_machine(run_dir: str | Path, load_start: float | None, note: str | None = None) -> Path:
    """``run_dir/machine.json`` (atomically); ``note`` says when it was written other than right after the job."""
    record = machine_record(load_start)
    if note:
        record["note"] = note
    return write_text_atomic(Path(run_dir) / "machine.json", json.dumps(record, indent=1) + "\n")
