"""Recovery per CPU-minute (issue 33, item 6): along one longer run per method (``recovery/<method>``,
``trainer.curve_every_n_steps``), the share of the log-perplexity gap closed on the WikiText-2 *validation* windows
against the training CPU time, read at 15 CPU-minutes and at the 60 % mark."""

from __future__ import annotations

from typing import Any

from spp.eval.perplexity import gap_closed
from spp.experiments.campaign33.labels import method_label, setting_label
from spp.experiments.campaign33.records import VAL_SOURCE, Campaign
from spp.experiments.collect_summaries import markdown_table

AT_MINUTES = 15.0
TARGET = 0.60


def reference_val(c: Campaign, setting: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The dense and pruned models' validation perplexity entries (``eval.py`` reference runs)."""
    ppl = {e.method: e.ppl.get(VAL_SOURCE) for e in c.evals
           if e.kind == "reference" and e.setting in ("dense", setting)}
    dense, pruned = ppl.get("dense"), ppl.get("pruned")
    return (dense, pruned) if dense and pruned else None


def curve(points: list[dict[str, Any]], dense: dict[str, Any], pruned: dict[str, Any]) -> list[dict[str, float]]:
    """Each point: CPU minutes, gap closed with its paired bootstrap interval over the validation windows."""
    out = []
    for p in points:
        g = gap_closed(dense, pruned, p)
        out.append({"cpu_min": p["train_cpu_s"] / 60.0, "step": p["step"], "gap": g["gap_closed"],
                    "low": g["gap_closed_low"], "high": g["gap_closed_high"]})
    return out


def at_minutes(points: list[dict[str, float]], minutes: float) -> dict[str, float] | None:
    """Gap closed (and interval) at ``minutes``, linear between the two points around it; ``None`` past the run."""
    for a, b in zip(points, points[1:], strict=False):
        if a["cpu_min"] <= minutes <= b["cpu_min"]:
            t = (minutes - a["cpu_min"]) / (b["cpu_min"] - a["cpu_min"]) if b["cpu_min"] > a["cpu_min"] else 0.0
            return {k: a[k] + t * (b[k] - a[k]) for k in ("gap", "low", "high")}
    return None


def minutes_to(points: list[dict[str, float]], target: float) -> float | None:
    """CPU minutes at which the gap closed first reaches ``target`` (linear between points); ``None`` if never."""
    for a, b in zip(points, points[1:], strict=False):
        if a["gap"] < target <= b["gap"]:
            return a["cpu_min"] + (target - a["gap"]) / (b["gap"] - a["gap"]) * (b["cpu_min"] - a["cpu_min"])
    return points[0]["cpu_min"] if points and points[0]["gap"] >= target else None


def curves(c: Campaign) -> dict[tuple[str, str], list[dict[str, float]]]:
    """Every recovery run's curve, by (setting, method)."""
    out = {}
    for r in c.train:
        ref = reference_val(c, r.setting)
        if r.kind == "recovery" and r.curve and ref:
            out[(r.setting, r.method)] = curve(r.curve, *ref)
    return out


def _point(p: dict[str, float]) -> str:
    return f"{100 * p['gap']:.1f} at {p['cpu_min']:.1f} min (step {p['step']})"


def recovery_table(c: Campaign) -> list[str]:
    """The recovery section (empty until a recovery run and the reference evaluations exist)."""
    rows = []
    for (setting, method), pts in curves(c).items():
        at = at_minutes(pts, AT_MINUTES)
        reach = minutes_to(pts, TARGET)
        rows.append([setting_label(setting), method_label(method),
                     f"{100 * at['gap']:.1f} [{100 * at['low']:.1f}, {100 * at['high']:.1f}]" if at else "past the run",
                     f"{reach:.1f}" if reach is not None else f"not within {pts[-1]['cpu_min']:.1f}",
                     _point(max(pts, key=lambda p: p["gap"])), _point(pts[-1])])
    if not rows:
        return []
    head = ["Setting", "Method", f"gap closed at {AT_MINUTES:g} CPU-min (%) [95 %]",
            f"CPU-min to {100 * TARGET:.0f} %", "highest point (%)", "last point (%)"]
    return ["## Recovery per CPU-minute (WikiText-2 validation windows)", "", *markdown_table(head, rows, 2), "",
            "CPU-min = process CPU time of the training steps (forward, backward, optimizer; one thread), not the "
            "evaluations. Intervals: paired bootstrap over the 40 windows (dense, pruned and the point resampled "
            "together), interpolated linearly between measured points.", ""]
