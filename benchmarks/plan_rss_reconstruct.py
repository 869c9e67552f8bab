"""The plan's reconstruct phase against the peak RSS of real ``train.py reconstruct=blockwise`` runs on this CPU.

A tiny LLaMA widened to 128 hidden (2 blocks) reconstructs 768 windows of 512 tokens (one epoch) and trains no
step (``trainer.max_steps=0``): the windows' hidden states (four sets of 192 MiB on one process) make the phase
the run's peak, about as large as the process's fixed cost. Each case runs with ``benchmarks/plan_rss.py``'s
probe (every process's own peak RSS, VmHWM) and a fresh cache; its plan is ``plan=true trainer.accelerator=cpu``
of the same command.

    python benchmarks/plan_rss_reconstruct.py   # writes docs/results/plan_rss_reconstruct.json and its table

``tests/test_plan_reconstruction.py`` runs both cases (slow) and checks the committed table against the JSON.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.plan_rss import measure, measured  # noqa: E402 - the repository first on the path

JSON_PATH = ROOT / "docs" / "results" / "plan_rss_reconstruct.json"
BEGIN, END = "<!-- plan-rss-reconstruct:begin -->\n", "<!-- plan-rss-reconstruct:end -->\n"
MIB = 2**20

ARGS = ["experiment=tiny_smoke", "+model.arch.hidden_size=128", "+model.arch.intermediate_size=256",
        "reconstruct=blockwise", "reconstruct.nsamples=768", "reconstruct.seqlen=512", "reconstruct.epochs=1",
        "trainer.max_steps=0", "eval=none", "dense_ppl=false", "pruned_ppl=false", "sample.enabled=false"]
"""768 windows: the C4 sample has 774 documents longer than 512 tokens of the byte tokenizer."""
TWO = ["trainer.devices=2", "trainer.accelerator=cpu"]
CASES = {"1 process": ARGS, "2 processes (DDP)": [*ARGS, *TWO]}


def planned(args: list[str]) -> dict[str, Any]:
    """The reconstruct phase of ``args`` planned for CPU processes: its terms on rank 0 and any other rank, and
    whether it is the plan's peak of each process."""
    from hydra import compose, initialize_config_dir

    from spp.planning.job import plan_output
    from spp.preflight.model_files import model_arch
    from spp.training.config import load_job, register_train_schema

    register_train_schema()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        job = load_job(compose("train", overrides=[*args, "trainer.accelerator=cpu"]))
    _text, plan = plan_output(job, model_arch(job.model))
    phase = next(p for p in plan["phases"] if p["name"] == "reconstruct")
    return {"rank0": phase["rank0"], "rank": phase["rank"],
            "is_peak": phase["rank0_bytes"] == plan["peak_rank0_bytes"] and (
                plan["devices_per_node"] == 1 or phase["rank_bytes"] == plan["peak_rank_bytes"])}


def ratios(rss: dict[int, float], plan: dict[str, Any], drop: tuple[str, ...] = ()) -> dict[int, float]:
    """Measured / planned per rank, the plan without the terms ``drop`` (a negative control)."""
    out = {}
    for rank, mib in rss.items():
        terms = plan["rank0" if rank == 0 else "rank"]
        out[rank] = mib / (sum(v for k, v in terms.items() if k not in drop) / MIB)
    return out


def compare(name: str, args: list[str], tmp: Path) -> dict[str, Any]:
    """Run one case and plan it."""
    load0, start = os.getloadavg(), time.time()
    code = measure(args, tmp).wait(timeout=1800)
    rss, plan = measured(tmp), planned(args)
    ratio = ratios(rss, plan)
    mib = {r: round(sum(plan["rank0" if r == 0 else "rank"].values()) / MIB, 1) for r in rss}
    ranks = {str(r): {"measured_mib": rss[r], "plan_mib": mib[r], "ratio": round(ratio[r], 3)} for r in sorted(rss)}
    return {"case": name, "command": "python train.py " + " ".join(args), "exit": code, "ranks": ranks,
            "reconstruct_is_the_plans_peak": plan["is_peak"], "seconds": round(time.time() - start, 1),
            "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()]}


def markdown(data: dict[str, Any]) -> str:
    """The table of ``docs/plan.md`` (from ``docs/results/plan_rss_reconstruct.json``)."""
    lines = ["| case | rank | measured peak RSS MiB | reconstruct phase, plan MiB | measured / plan | run s "
             "| load avg (1 min) before, after |", "|---|---|---|---|---|---|---|"]
    for case in data["cases"]:
        for rank, r in case["ranks"].items():
            lines.append(f"| {case['case']} | {rank} | {r['measured_mib']:.0f} | {r['plan_mib']:.0f} | "
                         f"{r['ratio']:.2f} | {case['seconds']:.0f} | {case['load_before'][0]:.1f}, "
                         f"{case['load_after'][0]:.1f} |")
    m = data["machine"]
    lines += ["", f"Python {m['python']}, torch {m['torch']}, {m['cpus']} CPU cores; commands in "
              "`docs/results/plan_rss_reconstruct.json`."]
    return "\n".join(lines) + "\n"


def main() -> None:
    import tempfile

    import torch

    from lab.bench.common import write_committed

    rows = []
    for name, args in CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(compare(name, args, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    data = {"machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()},
            "cases": rows}
    write_committed(JSON_PATH, json.dumps(data, indent=1) + "\n", ROOT / "docs" / "plan.md", BEGIN, END,
                    markdown(data))


if __name__ == "__main__":
    main()
