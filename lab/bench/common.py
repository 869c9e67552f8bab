"""Measurement helpers shared by the benchmarks: interleaved timing, peak memory, JSON output.

Peak memory on CPU is the peak resident set size (RSS) of this process during one step minus the RSS right
before it: Linux's high-water mark ``VmHWM`` is reset by writing ``5`` to ``/proc/self/clear_refs`` before the
step and read from ``/proc/self/status`` after it. glibc's malloc is told to serve every block over 64 KiB by
``mmap`` (and to trim freed heap) so that freed tensors leave the RSS and each step starts from the same level.
On CUDA it is ``torch.cuda.max_memory_allocated`` minus the allocation before the step.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from spp.atomic import write_text_atomic
from spp.paths import REPO_ROOT
from spp.report_text import markdown_lines

RESULTS_DIR = REPO_ROOT / "experiments" / "results"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def configure_malloc() -> bool:
    """Make freed tensors return to the OS (fixed mmap threshold 64 KiB); False where glibc is absent."""
    libc = _libc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024) == 1
    return ok and libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024) == 1


def trim_heap() -> bool:
    """Give glibc's free heap pages back to the OS (``malloc_trim(0)``) without changing its settings.

    After it, a step's allocations fault their pages in again, so its RSS high-water mark counts them, while the
    allocator keeps serving from the heap as it does in ``train.py``. False where glibc is absent.
    """
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


MALLOC_HELP = ("default: glibc's own settings, as train.py runs; trim: the 64 KiB mmap threshold of "
               "configure_malloc (freed tensors leave the process, but every larger allocation faults in fresh "
               "pages each step, which slowed LoRA's main-job step about 2x: benchmarks/README.md)")


def add_malloc_option(parser: argparse.ArgumentParser) -> None:
    """``--malloc default|trim`` for the timing benchmarks; apply it with ``apply_malloc``."""
    parser.add_argument("--malloc", default="default", choices=["default", "trim"], help=MALLOC_HELP)


def apply_malloc(choice: str) -> None:
    """Set the process's malloc for ``--malloc`` (``trim``: ``configure_malloc``; ``default``: leave glibc alone)."""
    if choice == "trim":
        configure_malloc()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def measure(step: Callable[[], Any], device: torch.device) -> tuple[float, float]:
    """Run ``step`` once; return (seconds, peak extra memory in MiB over the level before the step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        return dt, (torch.cuda.max_memory_allocated(device) - base) / 2**20
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    base = _status_kib("VmRSS")
    t0 = time.perf_counter()
    step()
    dt = time.perf_counter() - t0
    return dt, (_status_kib("VmHWM") - base) / 1024


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads): load on other cores does not inflate it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def interleaved(steps: dict[str, Callable[[], Any]], repeats: int, warmup: int, device: torch.device,
                progress: Any | None = None) -> dict[str, dict[str, Any]]:
    """Round-robin over ``steps`` (so machine load hits every variant alike); medians after ``warmup`` rounds.

    Each entry holds the wall time (``time_s``), the process CPU time (``cpu_s``, user + system of all its
    threads; with one thread it is the wall time the step would take on an idle machine), the peak memory and
    the 1-minute load average seen after each step (``loads``).
    """
    times: dict[str, list[float]] = {k: [] for k in steps}
    cpus: dict[str, list[float]] = {k: [] for k in steps}
    mems: dict[str, list[float]] = {k: [] for k in steps}
    loads: dict[str, list[float]] = {k: [] for k in steps}
    for rnd in range(warmup + repeats):
        for name, step in steps.items():
            c0 = cpu_seconds()
            dt, mem = measure(step, device)
            cpu = cpu_seconds() - c0
            if rnd >= warmup:
                times[name].append(dt)
                cpus[name].append(cpu)
                mems[name].append(mem)
                loads[name].append(os.getloadavg()[0])
            if progress is not None:
                progress()
    return {k: {"time_s": statistics.median(times[k]), "cpu_s": statistics.median(cpus[k]),
                "peak_mib": statistics.median(mems[k]), "times_s": times[k], "cpus_s": cpus[k],
                "peaks_mib": mems[k], "loads": loads[k]} for k in steps}


def add_ratios(results: dict[str, dict[str, Any]], reference: str) -> None:
    """Add ``time_ratio`` and ``mem_ratio`` of every entry relative to ``results[reference]`` in place."""
    ref = results[reference]
    for res in results.values():
        res["time_ratio"] = res["time_s"] / ref["time_s"]
        if "cpu_s" in res and ref.get("cpu_s"):
            res["cpu_ratio"] = res["cpu_s"] / ref["cpu_s"]
        res["mem_ratio"] = res["peak_mib"] / ref["peak_mib"] if ref["peak_mib"] > 0 else float("nan")


def environment(device: torch.device) -> dict[str, Any]:
    """Where the numbers come from."""
    env = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "device": str(device),
           "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def write_json(payload: dict[str, Any], name: str | Path, results_dir: Path = RESULTS_DIR) -> Path:
    """Write ``payload`` to ``results_dir/name`` (or to ``name`` if it is a path) atomically."""
    path = results_dir / name if len(Path(name).parts) == 1 else Path(name)
    return write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def markdown(results: dict[str, dict[str, Any]], title: str) -> str:
    """A Markdown table of one measurement group: time, peak memory and their ratios to the reference."""
    head = ["variant", "time (s)", "x ref", "CPU (s)", "x ref", "peak (MiB)", "x ref"]
    rows = [[name, f"{r['time_s']:.3f}", f"{r['time_ratio']:.2f}",
             *([f"{r['cpu_s']:.3f}", f"{r.get('cpu_ratio', float('nan')):.2f}"] if "cpu_s" in r else ["–", "–"]),
             f"{r['peak_mib']:.0f}", f"{r['mem_ratio']:.2f}"] for name, r in results.items()]
    return "\n".join([f"**{title}**", "", *markdown_lines(head, rows)])


def cuda_time(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` between CUDA events (after ``warmup`` untimed calls)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def replace_between(doc: str, begin: str, end: str, table: str) -> str:
    """``doc`` with the text between the markers ``begin`` and ``end`` replaced by ``table`` (the committed plan
    tables in ``docs/``)."""
    head, rest = doc.split(begin, 1)
    _old, tail = rest.split(end, 1)
    return head + begin + table + end + tail


def write_committed(json_path: Path, json_text: str, doc_path: Path, begin: str, end: str, table: str) -> None:
    """Write a benchmark's raw JSON and its table in ``doc_path``; print the table and name both files."""
    json_path.write_text(json_text)
    doc_path.write_text(replace_between(doc_path.read_text(), begin, end, table))
    print(table, end="")
    print(f"written: {json_path.relative_to(REPO_ROOT)}, the table in {doc_path.relative_to(REPO_ROOT)}",
          file=sys.stderr)
