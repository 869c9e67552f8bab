"""The run plan's host memory per process against the peak RSS of real ``train.py`` runs on this CPU (gloo).

Each case runs ``train.py`` with a ``sitecustomize`` probe on ``PYTHONPATH`` that writes every process's
``ru_maxrss`` at exit (its rank from ``RANK`` / ``LOCAL_RANK``), and plans the same command (``plan=true``
``trainer.accelerator=cpu``); a fresh cache directory per run, so every perplexity and pruning is computed (the
plan assumes cache misses).

    python benchmarks/plan_rss.py            # the tiny cases and SmolLM2-135M: writes docs/results/plan_rss.json
    python benchmarks/plan_rss.py tiny       # the tiny cases only (what tests/test_plan_rss.py checks)

SmolLM2's runs take minutes each on 2 cores.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JSON_PATH = ROOT / "docs" / "results" / "plan_rss.json"
MIB = 2**20
BEGIN, END = "<!-- plan-rss:begin -->\n", "<!-- plan-rss:end -->\n"

PROBE = """
import atexit, json, os, resource
def _write():
    out = os.environ.get("SPP_RSS_DIR")
    if out:
        rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux keeps this across exec: the parent's too
        try:  # this process's own peak (VmHWM is per address space; a fork of a large parent does not count)
            with open("/proc/self/status") as st:
                kib = next(int(line.split()[1]) for line in st if line.startswith("VmHWM:"))
        except (OSError, StopIteration):
            pass
        with open(os.path.join(out, f"rss-{rank}-{os.getpid()}.json"), "w") as fh:
            json.dump({"rank": int(rank), "maxrss_mib": round(kib / 1024, 1)}, fh)
atexit.register(_write)
"""
"""``sitecustomize.py`` of the runs: every Python process of the job writes its peak RSS when it exits."""

TINY = ["experiment=tiny_smoke", "+model.arch.hidden_size=256", "+model.arch.intermediate_size=768",
        "+model.arch.num_hidden_layers=4", "data.train_batch_size=16", "data.max_length=256", "trainer.max_steps=2",
        "eval=none", "dense_ppl=false", "pruned_ppl=false", "sample.enabled=false"]
"""The tiny LLaMA widened to 256 hidden x 4 blocks, with 16 x 256-token micro-batches: training activations of
about 0.5 GiB, so the model-dependent terms are of the size of the process baseline (the plain tiny model's are
below 1 MiB). No perplexity: the byte tokenizer's 1.3 M-token WikiText-2 would add its own term."""
TWO = ["trainer.devices=2", "strategy=fsdp", "trainer.accelerator=cpu"]
CASES = {"tiny, 1 process": TINY, "tiny, 2 processes FSDP2": [*TINY, *TWO],
         "SmolLM2-135M debug=fast, 1 process": ["debug=fast"],
         "SmolLM2-135M debug=fast, 2 processes FSDP2": ["debug=fast", *TWO]}


def env(probe_dir: Path, out: Path) -> dict[str, str]:
    """The runs' environment: offline, the probe first on ``PYTHONPATH``, then this repository."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "WANDB_MODE": "offline", "PYTHONPATH": f"{probe_dir}{os.pathsep}{ROOT}", "SPP_RSS_DIR": str(out)}


def measure(args: list[str], tmp: Path) -> subprocess.Popen:
    """Start ``train.py args`` with the probe in ``tmp`` (a fresh run and cache directory); returns the process."""
    (tmp / "probe").mkdir(parents=True, exist_ok=True)
    (tmp / "probe" / "sitecustomize.py").write_text(PROBE)
    (tmp / "rss").mkdir(exist_ok=True)
    cmd = [sys.executable, "train.py", *args, f"run_dir={tmp / 'run'}", f"cache_dir={tmp / 'cache'}"]
    log = open(tmp / "log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(cmd, cwd=ROOT, env=env(tmp / "probe", tmp / "rss"), stdout=log, stderr=subprocess.STDOUT)


def measured(tmp: Path) -> dict[int, float]:
    """Peak RSS (MiB) by rank of a finished run (the launcher's own process, if any, is rank 0's)."""
    out: dict[int, float] = {}
    for path in (tmp / "rss").glob("rss-*.json"):
        entry = json.loads(path.read_text())
        out[entry["rank"]] = max(out.get(entry["rank"], 0.0), entry["maxrss_mib"])
    return out


def planned(args: list[str]) -> dict[str, float]:
    """The plan's peak host memory per process (MiB): ``rank0`` and ``rank`` (any other), planned for the CPU."""
    proc = subprocess.run([sys.executable, "train.py", *args, "trainer.accelerator=cpu", "plan=true", "plan_json=-"],
                          cwd=ROOT, env=env(ROOT, ROOT), capture_output=True, text=True, timeout=600, check=True)
    plan = json.loads(proc.stdout)
    return {"rank0": round(plan["peak_rank0_bytes"] / MIB, 1), "rank": round(plan["peak_rank_bytes"] / MIB, 1)}


def compare(name: str, args: list[str], tmp: Path) -> dict[str, Any]:
    """Run one case and plan it: measured and planned MiB per rank, their ratio, the machine's load."""
    load0, start = os.getloadavg(), time.time()
    proc = measure(args, tmp)
    code = proc.wait(timeout=1800)
    rss = measured(tmp)
    plan = planned(args)
    ranks = {str(r): {"measured_mib": m, "plan_mib": plan["rank0" if r == 0 else "rank"],
                      "ratio": round(m / plan["rank0" if r == 0 else "rank"], 3)} for r, m in sorted(rss.items())}
    return {"case": name, "command": "python train.py " + " ".join(args), "exit": code, "ranks": ranks,
            "seconds": round(time.time() - start, 1), "load_before": [round(x, 2) for x in load0],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    import tempfile

    names = [n for n in CASES if "tiny" in n] if sys.argv[1:] == ["tiny"] else list(CASES)
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(compare(name, CASES[name], Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    import torch

    meta = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()}
    if names == list(CASES):
        data = {"machine": meta, "cases": rows}
        JSON_PATH.write_text(json.dumps(data, indent=1) + "\n")
        write_table(data)
        print(f"written: {JSON_PATH.relative_to(ROOT)}, the table in docs/plan.md", file=sys.stderr)


def write_table(data: dict[str, Any]) -> None:
    """Put :func:`markdown` between the markers of ``docs/plan.md``."""
    doc = ROOT / "docs" / "plan.md"
    from lab.bench.common import replace_between

    doc.write_text(replace_between(doc.read_text(), BEGIN, END, markdown(data)))






def markdown(data: dict[str, Any]) -> str:
    """The measured-against-planned table of ``docs/plan.md`` (from ``docs/results/plan_rss.json``)."""
    lines = ["| case | rank | measured peak RSS MiB | plan MiB | measured / plan | run s "
             "| load avg (1 min) before, after |", "|---|---|---|---|---|---|---|"]
    for case in data["cases"]:
        for rank, r in case["ranks"].items():
            lines.append(f"| {case['case']} | {rank} | {r['measured_mib']:.0f} | {r['plan_mib']:.0f} | "
                         f"{r['ratio']:.2f} | {case['seconds']:.0f} | {case['load_before'][0]:.1f}, "
                         f"{case['load_after'][0]:.1f} |")
    m = data["machine"]
    lines += ["", f"Python {m['python']}, torch {m['torch']}, {m['cpus']} CPU cores; commands in "
              "`docs/results/plan_rss.json`."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
