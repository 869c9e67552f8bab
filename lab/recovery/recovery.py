"""Recovery per CPU-minute: along one longer run per method (``recovery/<method>``,
``trainer.curve_every_n_steps``), the share of the log-perplexity gap closed on the WikiText-2 *validation* windows
against the training CPU time, read at 15 CPU-minutes and at the 60 % mark. A run trained again on another machine
(``recovery_check/<method>``) is a row of its own: CPU minutes compare only on one machine, so each method is read
against the SPP curve measured on its own machine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lab.collect_summaries import markdown_table
from lab.recovery.choices import REFERENCE, method_order
from lab.recovery.labels import method_label, setting_label
from lab.recovery.records import VAL_SOURCE, Campaign, TrainRun, cpu_name
from spp.eval.perplexity import gap_closed, paired_difference

AT_MINUTES = 15.0
AT_STEP = 64
"""The common step every curve measured (the end of the first epoch of 63 steps): each method at the same amount of
training, where the CPU-minute reading catches each at another point of its schedule."""
TARGET = 0.60
KINDS = ("recovery", "recovery_check")
"""The first recovery run of a method, and the same run trained again (on a second machine)."""


def machine_key(run: TrainRun) -> str:
    """The CPU a run recorded (``machine.json``)."""
    return cpu_name(run.machine)


def recovery_runs(c: Campaign) -> list[TrainRun]:
    """Every run with a recovery curve, in method order, each method's first run before its re-run."""
    return sorted((r for r in c.train if r.kind in KINDS and r.curve),
                  key=lambda r: (method_order(r.method), KINDS.index(r.kind)))


def machine_letters(c: Campaign) -> dict[str, str]:
    """``A``, ``B``, ... for the CPUs of the recovery runs, in the order they first appear."""
    keys = dict.fromkeys(machine_key(r) for r in recovery_runs(c))
    return {k: chr(ord("A") + i) for i, k in enumerate(keys)}


def run_label(run: TrainRun) -> str:
    """``LoRA*``; ``LoRA* (re-run)`` for a ``recovery_check`` run."""
    return method_label(run.method) + (" (re-run)" if run.kind == "recovery_check" else "")


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


def bracket(times: list[float], x: float) -> tuple[int, float] | None:
    """The first ``i`` with ``times[i] <= x <= times[i + 1]`` and ``x``'s fraction of the way between them; ``None``
    when ``x`` lies outside."""
    for i, (a, b) in enumerate(zip(times, times[1:], strict=False)):
        if a <= x <= b:
            return i, (x - a) / (b - a) if b > a else 0.0
    return None


def at_minutes(points: list[dict[str, float]], minutes: float) -> dict[str, float] | None:
    """Gap closed (and interval) at ``minutes``, linear between the two points around it; ``None`` past the run."""
    where = bracket([p["cpu_min"] for p in points], minutes)
    if where is None:
        return None
    i, t = where
    a, b = points[i], points[i + 1]
    return {k: a[k] + t * (b[k] - a[k]) for k in ("gap", "low", "high")}


def minutes_to(points: list[dict[str, float]], target: float) -> float | None:
    """CPU minutes at which the gap closed first reaches ``target`` (linear between points); ``None`` if never."""
    for a, b in zip(points, points[1:], strict=False):
        if a["gap"] < target <= b["gap"]:
            return a["cpu_min"] + (target - a["gap"]) / (b["gap"] - a["gap"]) * (b["cpu_min"] - a["cpu_min"])
    return points[0]["cpu_min"] if points and points[0]["gap"] >= target else None


def curves(c: Campaign) -> list[tuple[TrainRun, list[dict[str, float]]]]:
    """Every recovery run with its curve, in table order (runs whose setting lacks reference evaluations left out)."""
    out = []
    for r in recovery_runs(c):
        ref = reference_val(c, r.setting)
        if ref:
            out.append((r, curve(r.curve, *ref)))
    return out


def entry_at(raw: list[dict[str, Any]], minutes: float) -> dict[str, Any] | None:
    """A run's validation entry at ``minutes`` of training CPU time: each window's NLL linear between the two measured
    points around it (the reading :func:`at_minutes` makes of the gap); ``None`` past the run."""
    where = bracket([p["train_cpu_s"] / 60.0 for p in raw], minutes)
    if where is None:
        return None
    i, t = where
    a, b = raw[i], raw[i + 1]
    return {**a, "window_nll": [x + t * (y - x) for x, y in zip(a["window_nll"], b["window_nll"], strict=True)]}


def spp_on_same_machine(runs: list[TrainRun], run: TrainRun) -> TrainRun | None:
    """Among ``runs``, SPP's recovery run of ``run``'s setting measured on ``run``'s machine (the same kind
    preferred)."""
    same = [r for r in runs if r.method == REFERENCE and r.setting == run.setting
            and machine_key(r) == machine_key(run)]
    return next((r for r in same if r.kind == run.kind), same[0] if same else None)


def _against_spp(c: Campaign, pick: Callable[[list[dict[str, Any]]], dict[str, Any] | None]) -> dict[str, str]:
    """By run place: the run's validation perplexity over SPP's (SPP measured on the same machine) at the curve
    point ``pick`` chooses, paired over the windows (one run each)."""
    out, runs = {}, recovery_runs(c)
    for run in runs:
        spp = spp_on_same_machine(runs, run)
        if run.method == REFERENCE or spp is None:
            continue
        a, b = pick(run.curve), pick(spp.curve)
        if a and b:
            d = paired_difference(a, b)
            out[run.rel] = f"{d['ppl_ratio']:.3f} [{d['ppl_ratio_low']:.3f}, {d['ppl_ratio_high']:.3f}]"
    return out


def against_spp_at(c: Campaign, minutes: float = AT_MINUTES) -> dict[str, str]:
    """:func:`_against_spp` at ``minutes`` of CPU time."""
    return _against_spp(c, lambda curve: entry_at(curve, minutes))


def point_at_step(points: list[dict[str, Any]], step: int) -> dict[str, Any] | None:
    """The measured point at ``step`` (``None`` when the curve has none there)."""
    return next((p for p in points if p["step"] == step), None)


def against_spp_at_step(c: Campaign, step: int = AT_STEP) -> dict[str, str]:
    """:func:`_against_spp` at the measured ``step``."""
    return _against_spp(c, lambda curve: point_at_step(curve, step))


def _gap_text(p: dict[str, float] | None) -> str:
    return f"{100 * p['gap']:.1f} [{100 * p['low']:.1f}, {100 * p['high']:.1f}]" if p else "–"


def _point(p: dict[str, float]) -> str:
    return f"{100 * p['gap']:.1f} at {p['cpu_min']:.1f} min (step {p['step']})"


def recovery_table(c: Campaign, drawn: list[tuple[TrainRun, list[dict[str, float]]]]) -> list[str]:
    """The recovery section from :func:`curves`'s ``drawn`` (empty until a recovery run and the reference evaluations
    exist)."""
    rows, versus, at_step, letters = [], against_spp_at(c), against_spp_at_step(c), machine_letters(c)
    for run, pts in drawn:
        at = at_minutes(pts, AT_MINUTES)
        reach = minutes_to(pts, TARGET)
        rows.append([setting_label(run.setting), run_label(run), letters[machine_key(run)],
                     _gap_text(at) if at else "past the run",
                     f"{reach:.1f}" if reach is not None else f"not within {pts[-1]['cpu_min']:.1f}",
                     versus.get(run.rel, "–"), _point(max(pts, key=lambda p: p["gap"])), _point(pts[-1]),
                     _gap_text(point_at_step(pts, AT_STEP)), at_step.get(run.rel, "–")])
    if not rows:
        return []
    head = ["Setting", "Method", "CPU", f"gap closed at {AT_MINUTES:g} CPU-min (%) [95 %]",
            f"CPU-min to {100 * TARGET:.0f} %", f"val PPL / SPP's at {AT_MINUTES:g} CPU-min, same CPU [95 %]",
            "highest point (%)", "last point (%)", f"gap closed at step {AT_STEP} (%) [95 %]",
            f"val PPL / SPP's at step {AT_STEP} [95 %]"]
    cpus = "; ".join(f"{letter} = {key}" for key, letter in letters.items())
    return ["## Recovery per CPU-minute and per step (WikiText-2 validation windows)", "",
            *markdown_table(head, rows, 3), "",
            *_reading_notes(drawn, any(r.kind == "fresh" and r.curve for r in c.train)),
            "CPU-min = process CPU time of the training steps (forward, backward, optimizer; one thread), not the "
            "evaluations. Intervals: paired bootstrap over the 40 windows (dense, pruned and the point resampled "
            "together), interpolated linearly between measured points; the ratio to SPP pairs the two runs' windows, "
            "each window's NLL interpolated the same way, SPP's curve taken on the run's own CPU (one run per method: "
            f"windows only, not seeds). CPUs (`machine.json`): {cpus}.", ""]


def _reading_notes(drawn: list[tuple[TrainRun, list[dict[str, float]]]], tested: bool = False) -> list[str]:
    """What the two readings mean, and the fall after the highest point (counted from the curves)."""
    fell = [run for run, pts in drawn if pts[-1]["gap"] < max(p["gap"] for p in pts)]
    peak_steps = sorted({max(pts, key=lambda p: p["gap"])["step"] for _, pts in drawn})
    return [f"Two readings: at {AT_MINUTES:g} CPU-minutes each method stands at another point of its two-epoch "
            "schedule (a faster step reaches further), so that column compares cost; at the common step "
            f"{AT_STEP} every method has seen the same records the same number of times, so that column compares "
            f"what the same training did. In {len(fell)} of {len(drawn)} curves the gap closed falls after its "
            f"highest point (at step {', '.join(map(str, peak_steps))}) during the second epoch, which repeats the "
            "first epoch's records" + (": the next section tests whether the repetition causes it." if tested else
                                       "; that repetition causes the fall is a likely reading that was not tested "
                                       "(a run on records it has not seen: not run)."), ""]
