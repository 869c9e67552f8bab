"""The run plan's host memory per process against the peak RSS of real ``train.py`` runs on this CPU: the widened
tiny LLaMA of ``benchmarks/plan_rss.py`` on 1 process and on 2 gloo processes (FSDP2), both within ±25 % of the
plan on every rank. Both runs go at once (about a minute on a loaded 2-core machine: memory does not depend on
the load). ``docs/plan.md`` has the same comparison for SmolLM2-135M (minutes; ``python benchmarks/plan_rss.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import compose_train

from benchmarks.plan_rss import TINY, TWO, measure, measured
from spp.planning.job import plan_output
from spp.preflight.model_files import model_arch
from spp.training.config import load_job

MIB = 2**20
TOLERANCE = 0.25


def _plan(args: list[str]) -> dict[int, float]:
    """The plan's peak host MiB of rank 0 and of rank 1, planned for CPU processes (``plan=true``'s JSON)."""
    job = load_job(compose_train([*args, "trainer.accelerator=cpu"]))
    _text, data = plan_output(job, model_arch(job.model))
    return {0: data["peak_rank0_bytes"] / MIB, 1: data["peak_rank_bytes"] / MIB}


@pytest.mark.slow  # measures the peak RSS of 1- and 2-process runs (56 s loaded); CI runs it
def test_peak_rss_per_process_is_within_25_percent_of_the_plan(tmp_path: Path):
    cases = {"one": TINY, "two": [*TINY, *TWO]}
    procs = {name: measure(args, tmp_path / name) for name, args in cases.items()}
    for name, proc in procs.items():
        assert proc.wait(timeout=900) == 0, (tmp_path / name / "log").read_text()[-3000:]
    for name, args in cases.items():
        plan, rss = _plan(args), measured(tmp_path / name)
        assert sorted(rss) == ([0] if name == "one" else [0, 1]), rss
        for rank, mib in rss.items():
            ratio = mib / plan[rank]
            print(f"{name}, rank {rank}: {mib:.0f} MiB measured, {plan[rank]:.0f} planned ({ratio:.2f})")
            assert abs(ratio - 1) <= TOLERANCE, f"{name}, rank {rank}: {mib:.0f} MiB measured, {plan[rank]:.0f} planned"
