"""Coverage of the recovery study's paired intervals with few seeds, simulated on its own per-window data
(``python -m lab.recovery coverage ROOT --out experiments/results/recovery_interval_coverage.json``).

For each seed-paired comparison with at least 2 seeds, the observed differences ``d[s, w]`` (:mod:`.stats`) are split
into their mean ``mu``, a window profile ``a_w`` (mean over seeds, less ``mu``), seed offsets ``b_s`` (mean over
windows, less ``mu``) and the rest ``e[s, w]``. A synthetic experiment of ``n`` seeds draws ``W`` windows with
replacement from the observed profile, one offset per seed from a normal distribution with the observed seed-to-seed
standard deviation of ``b``, and for each seed the rest of an observed seed on the drawn windows (scaled by
``sqrt(S / (S - 1))``): ``d*[k, i] = mu + a[j_i] + beta_k + c e[s_k, j_i]``. The true log-ratio is ``mu``; the
check counts how often each interval, computed on ``d*`` as the report computes it, contains it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lab.recovery.choices import REFERENCE, Choice, choices, closest_competitor
from lab.recovery.distillation import distilled
from lab.recovery.labels import method_label, setting_label
from lab.recovery.records import Campaign, TrainRun, load
from lab.recovery.stats import nll_differences, seed_t_interval, t_quantile, two_level_bootstrap

REPLICATES = 1000
SEED_COUNTS = (3, 5)
SIMULATION_SEED = 20240
BOOTSTRAP_IN_SIMULATION = 1000
"""Resamples of each simulated two-level bootstrap (the report draws 2,000; 1,000 moves a percentile by far less
than the coverage's own simulation error)."""
COMMAND = ("python -m lab.recovery coverage experiments/results/runs/recovery "
           "--out experiments/results/recovery_interval_coverage.json")


def seed_only_t(d: np.ndarray) -> tuple[float, float]:
    """Student's t on the per-seed log-ratios alone (the seeds' spread on the fixed windows, ``n - 1`` df)."""
    r = d.mean(axis=1)
    half = t_quantile(len(r) - 1) * float(r.std(ddof=1)) / math.sqrt(len(r))
    return float(r.mean()) - half, float(r.mean()) + half


INTERVALS: dict[str, Callable[[np.ndarray], tuple[float, float]]] = {
    "two-level bootstrap (seeds x windows)": lambda d: two_level_bootstrap(d, BOOTSTRAP_IN_SIMULATION),
    "t on seeds only (n-1 df)": seed_only_t,
    "t on seeds + window variance (n-1 df; the verdicts')": seed_t_interval,
}


def _pairs(c: Campaign, chosen: dict[tuple[str, str], Choice]) -> list[tuple[str, list[TrainRun], list[TrainRun]]]:
    """Every seed-paired comparison of the report with at least 2 shared seeds: (name, runs a, runs b)."""
    out = [(f"{setting_label(s)}: {method_label(m)} / SPP", list(ch.runs), list(chosen[(s, REFERENCE)].runs))
           for (s, m), ch in chosen.items() if m != REFERENCE and (s, REFERENCE) in chosen]
    kd = distilled(c)
    for (s, m), runs in kd.items():
        if (s, m) in chosen:
            out.append((f"{setting_label(s)}: {method_label(m)} distill / CE", runs, list(chosen[(s, m)].runs)))
    for s in dict.fromkeys(s for s, _ in kd):
        rival = closest_competitor(chosen, s)
        if rival and (s, rival) in kd and (s, REFERENCE) in kd:
            out.append((f"{setting_label(s)}: {method_label(rival)} / SPP, both distilled", kd[(s, rival)],
                        kd[(s, REFERENCE)]))
    return out


def differences(a: list[TrainRun], b: list[TrainRun]) -> np.ndarray | None:
    """``d[s, w]`` over the seeds both ran (``None`` under 2)."""
    ta, tb = {r.seed: r.test for r in a}, {r.seed: r.test for r in b}
    seeds = sorted(ta.keys() & tb.keys())
    return nll_differences([ta[s] for s in seeds], [tb[s] for s in seeds]) if len(seeds) >= 2 else None


def simulate(d: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """One synthetic ``n``-seed experiment from the observed ``d`` (module docstring)."""
    s, w = d.shape
    mu = d.mean()
    a, b = d.mean(axis=0) - mu, d.mean(axis=1) - mu
    e = (d - mu - a[None, :] - b[:, None]) * math.sqrt(s / (s - 1))
    j = rng.integers(0, w, size=w)
    beta = rng.normal(0.0, float(b.std(ddof=1)), size=n)
    rows = rng.integers(0, s, size=n)
    return mu + a[j][None, :] + beta[:, None] + e[rows][:, j]


def coverage(d: np.ndarray, n: int, replicates: int, seed: int) -> dict[str, float]:
    """Share of ``replicates`` synthetic ``n``-seed experiments whose interval contains the true log-ratio."""
    rng = np.random.default_rng(seed)
    mu, hits = float(d.mean()), dict.fromkeys(INTERVALS, 0)
    for _ in range(replicates):
        x = simulate(d, n, rng)
        for name, interval in INTERVALS.items():
            lo, hi = interval(x)
            hits[name] += lo <= mu <= hi
    return {name: hits[name] / replicates for name in INTERVALS}


def run(root: str, replicates: int = REPLICATES, seed_counts: tuple[int, ...] = SEED_COUNTS) -> dict[str, Any]:
    """The coverage check over every comparison of the study under ``root`` (what the JSON holds)."""
    c = load(root)
    rows = []
    for i, (name, a, b) in enumerate(_pairs(c, choices(c))):
        d = differences(a, b)
        if d is None:
            continue
        row: dict[str, Any] = {"comparison": name, "seeds": d.shape[0], "windows": d.shape[1],
                               "ratio": round(math.exp(float(d.mean())), 6),
                               "seed_sd": round(float(d.mean(axis=1).std(ddof=1)), 6),
                               "window_sd": round(float(d.mean(axis=0).std(ddof=1)), 6)}
        row["coverage"] = {str(n): coverage(d, n, replicates, SIMULATION_SEED + 100 * i + n) for n in seed_counts}
        rows.append(row)
    mean = {str(n): {k: round(float(np.mean([r["coverage"][str(n)][k] for r in rows])), 4) for k in INTERVALS}
            for n in seed_counts} if rows else {}
    return {"command": COMMAND, "replicates": replicates, "simulation_seed": SIMULATION_SEED,
            "bootstrap_resamples": BOOTSTRAP_IN_SIMULATION, "nominal": 0.95, "intervals": list(INTERVALS),
            "comparisons": rows, "mean_coverage": mean}


COVERAGE_FILE = "recovery_interval_coverage.json"
"""The check's result, beside the report (``experiments/results/``, two levels above the campaign directory)."""


def coverage_file(root: Path) -> Path:
    """Where the coverage check of the campaign under ``root`` is committed."""
    return root.parent.parent / COVERAGE_FILE


def coverage_lines(root: Path) -> list[str]:
    """The paragraph quoting the committed coverage check under the paired table (empty when it is absent)."""
    path = coverage_file(root)
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    verdicts = data["intervals"][-1]

    def pct(v: float) -> str:
        return f"{100 * v:.1f} %"

    means = "; ".join(f"{n} seeds: " + ", ".join(f"{name} {pct(v)}" for name, v in by.items())
                      for n, by in data["mean_coverage"].items())
    lowest = {n: min(r["coverage"][n][verdicts] for r in data["comparisons"]) for n in data["mean_coverage"]}
    return [f"Coverage check (`{data['command']}`, `lab/recovery/coverage.py`, result `experiments/results/{path.name}`"
            f"): {data['replicates']:,} synthetic experiments per comparison and seed count, built from each of the "
            f"{len(data['comparisons'])} seed-paired comparisons' own per-window data (its window profile "
            "resampled, normal seed offsets with its observed seed-to-seed spread, its seed × window residuals; true "
            "ratio known). "
            f"Share of intervals containing the true ratio, mean over comparisons (nominal 95 %): {means}. The "
            "verdicts' interval, lowest comparison: " + ", ".join(f"{pct(v)} at {n} seeds" for n, v in lowest.items())
            + ".", ""]
