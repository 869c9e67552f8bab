"""Recovery per CPU-minute (issue 33, item 6): along one longer run per method (``recovery/<method>``,
``trainer.curve_every_n_steps``), the share of the log-perplexity gap closed on the WikiText-2 *validation* windows
against the training CPU time, read at 15 CPU-minutes and at the 60 % mark."""

from __future__ import annotations

from typing import Any

from spp.eval.perplexity import gap_closed, paired_difference
from spp.experiments.campaign33.choices import REFERENCE, method_order
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
    """Every recovery run's curve, by (setting, method) in table order."""
    out = {}
    for r in sorted(c.train, key=lambda r: method_order(r.method)):
        ref = reference_val(c, r.setting)
        if r.kind == "recovery" and r.curve and ref:
            out[(r.setting, r.method)] = curve(r.curve, *ref)
    return out


def entry_at(raw: list[dict[str, Any]], minutes: float) -> dict[str, Any] | None:
    """A run's validation entry at ``minutes`` of training CPU time: each window's NLL linear between the two measured
    points around it (the reading :func:`at_minutes` makes of the gap); ``None`` past the run."""
    for a, b in zip(raw, raw[1:], strict=False):
        ta, tb = a["train_cpu_s"] / 60.0, b["train_cpu_s"] / 60.0
        if ta <= minutes <= tb:
            t = (minutes - ta) / (tb - ta) if tb > ta else 0.0
            return {**a, "window_nll": [x + t * (y - x) for x, y in zip(a["window_nll"], b["window_nll"], strict=True)]}
    return None


def against_spp_at(c: Campaign, minutes: float = AT_MINUTES) -> dict[tuple[str, str], str]:
    """Each method's validation perplexity over SPP's at ``minutes``, paired over the windows (one run each)."""
    raw = {(r.setting, r.method): r.curve for r in c.train if r.kind == "recovery" and r.curve}
    out = {}
    for (setting, method), points in raw.items():
        a, b = entry_at(points, minutes), entry_at(raw.get((setting, REFERENCE), []), minutes)
        if method != REFERENCE and a and b:
            d = paired_difference(a, b)
            out[(setting, method)] = f"{d['ppl_ratio']:.3f} [{d['ppl_ratio_low']:.3f}, {d['ppl_ratio_high']:.3f}]"
    return out


def _point(p: dict[str, float]) -> str:
    return f"{100 * p['gap']:.1f} at {p['cpu_min']:.1f} min (step {p['step']})"


def recovery_table(c: Campaign) -> list[str]:
    """The recovery section (empty until a recovery run and the reference evaluations exist)."""
    rows, versus = [], against_spp_at(c)
    for (setting, method), pts in curves(c).items():
        at = at_minutes(pts, AT_MINUTES)
        reach = minutes_to(pts, TARGET)
        rows.append([setting_label(setting), method_label(method),
                     f"{100 * at['gap']:.1f} [{100 * at['low']:.1f}, {100 * at['high']:.1f}]" if at else "past the run",
                     f"{reach:.1f}" if reach is not None else f"not within {pts[-1]['cpu_min']:.1f}",
                     versus.get((setting, method), "–"), _point(max(pts, key=lambda p: p["gap"])), _point(pts[-1])])
    if not rows:
        return []
    head = ["Setting", "Method", f"gap closed at {AT_MINUTES:g} CPU-min (%) [95 %]",
            f"CPU-min to {100 * TARGET:.0f} %", f"val PPL / SPP's at {AT_MINUTES:g} CPU-min [95 %]",
            "highest point (%)", "last point (%)"]
    return ["## Recovery per CPU-minute (WikiText-2 validation windows)", "", *markdown_table(head, rows, 2), "",
            "CPU-min = process CPU time of the training steps (forward, backward, optimizer; one thread), not the "
            "evaluations. Intervals: paired bootstrap over the 40 windows (dense, pruned and the point resampled "
            "together), interpolated linearly between measured points; the ratio to SPP pairs the two runs' windows, "
            "each window's NLL interpolated the same way (one run per method: windows only, not seeds).", ""]
