"""Recovery per CPU-minute: the share of the log-perplexity gap closed on the WikiText-2 *validation*
windows against training CPU minutes, each point with its paired bootstrap interval over windows.

A reconstruction alone is one point at its CPU time (``reconstruction.timings.cpu_seconds``; the model does not
change after it). SPP end to end alone is its recovery curve (``train_cpu_s``). The reconstruction followed by SPP end
to end is its curve offset by the reconstruction's CPU time (its step 0 is the reconstructed model). Each reads
whether it reaches 60 % within 15 CPU-minutes (measured points only) and, where SPP end to end's curve covers the
same CPU time, its validation perplexity over SPP end to end's there, paired over the windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lab.collect_summaries import markdown_table
from lab.reconstruction.grids import choices, order, within_budget
from lab.reconstruction.records import VAL_SOURCE, Campaign, Run
from lab.recovery.labels import method_label, rate, setting_label
from lab.recovery.recovery import entry_at, minutes_to
from spp.eval.perplexity import gap_closed, paired_difference

AT_MINUTES = 15.0
TARGET = 0.60


@dataclass(frozen=True)
class Line:
    """One row of the recovery table: a run's measured points (``cpu_min``, ``gap``, ``low``, ``high``, ``step``)
    and its raw validation entries with ``train_cpu_s`` on the same clock."""

    run: Run
    label: str
    points: tuple[dict[str, float], ...]
    raw: tuple[dict[str, Any], ...]


def describe(run: Run) -> str:
    """``SPP form, lr 1e-1, 3 ep.``; ``… then SPP end to end``; ``SPP end to end alone``."""
    if run.form is None:
        return "SPP end to end alone"
    text = f"{method_label(run.form)} form, lr {rate(run.lr)}, {run.epochs} ep."
    return text + (" then SPP end to end" if run.kind == "then_e2e" else "")


def gap(dense: dict[str, Any] | None, pruned: dict[str, Any] | None,
        merged: dict[str, Any] | None) -> dict[str, float] | None:
    """:func:`~spp.eval.perplexity.gap_closed`, or ``None`` when an entry is missing, the pruned model is not worse
    than the dense one, or the entries are not on the same windows (a row then reads ``–``)."""
    if not dense or not pruned or not merged:
        return None
    try:
        return gap_closed(dense, pruned, merged)
    except ValueError:
        return None


def raw_points(run: Run) -> list[dict[str, Any]]:
    """The run's validation entries with ``train_cpu_s`` counted from the start of the reconstruction."""
    if run.kind in ("e2e", "then_e2e"):
        return [{**p, "train_cpu_s": float(p["train_cpu_s"]) + (run.recon_cpu_s or 0.0)} for p in run.curve]
    return [{**run.val, "train_cpu_s": run.recon_cpu_s, "step": 0}] if run.val and run.recon_cpu_s else []


def line(run: Run, dense: dict[str, Any], pruned: dict[str, Any]) -> Line | None:
    """The run's points read against the dense and pruned validation entries (``None`` when there is no gap to
    close)."""
    raw = raw_points(run)
    pts = []
    for p in raw:
        g = gap(dense, pruned, p)
        if g is None:
            return None
        pts.append({"cpu_min": p["train_cpu_s"] / 60.0, "step": int(p.get("step", 0)), "gap": g["gap_closed"],
                    "low": g["gap_closed_low"], "high": g["gap_closed_high"]})
    return Line(run, describe(run), tuple(pts), tuple(raw))


def lines(c: Campaign) -> list[Line]:
    """Every setting's chosen reconstructions alone (and the best within the budget where the chosen one is past
    it), the runs reconstructing then training, and SPP end to end
    alone, in table order (a setting without both reference evaluations is left out)."""
    picked = [ch.chosen for ch in choices(c)] + within_budget(c, AT_MINUTES)
    picked += sorted((r for r in c.runs if r.kind in ("e2e", "then_e2e") and r.curve),
                     key=lambda r: (*order(r.setting, r.form), r.kind == "then_e2e", r.rel))
    out = []
    for run in sorted(picked, key=lambda r: order(r.setting, None)[:1]):
        ref = c.reference(run.setting, VAL_SOURCE)
        ln = line(run, *ref) if ref and raw_points(run) else None
        if ln is not None:
            out.append(ln)
    return out


def best_within(ln: Line, minutes: float = AT_MINUTES) -> int | None:
    """The index of the measured point with the largest gap closed at or before ``minutes``."""
    inside = [i for i, p in enumerate(ln.points) if p["cpu_min"] <= minutes]
    return max(inside, key=lambda i: ln.points[i]["gap"]) if inside else None


def first_at(ln: Line, target: float = TARGET) -> float | None:
    """CPU minutes at which the gap closed reaches ``target`` (linear between curve points); ``None`` if never."""
    return minutes_to(list(ln.points), target)


def against_e2e(c: Campaign, ln: Line, i: int) -> str:
    """Validation PPL of ``ln``'s measured point ``i`` over SPP end to end's (same setting) at the same CPU time,
    paired over the windows (each window's NLL linear between the curve points around it); ``–`` outside its curve."""
    e2e = next((r for r in c.runs if r.kind == "e2e" and r.setting == ln.run.setting and r.curve), None)
    if e2e is None or ln.run is e2e:
        return "–"
    theirs = entry_at(raw_points(e2e), ln.points[i]["cpu_min"])
    try:
        d = paired_difference(ln.raw[i], theirs) if theirs else None
    except ValueError:  # not on the same windows
        d = None
    if d is None:
        return "–"
    return f"{d['ppl_ratio']:.3f} [{d['ppl_ratio_low']:.3f}, {d['ppl_ratio_high']:.3f}]"


def _gap(p: dict[str, float]) -> str:
    return f"{100 * p['gap']:.1f} [{100 * p['low']:.1f}, {100 * p['high']:.1f}]"


def _row(c: Campaign, ln: Line) -> list[str]:
    i, reach = best_within(ln), first_at(ln)
    best = ln.points[i] if i is not None else None
    ok = reach is not None and reach <= AT_MINUTES
    verdict = (f"**yes** ({reach:.1f} min)" if ok else
               f"no: {100 * (TARGET - best['gap']):.1f} points short" if best else
               f"no: first point at {ln.points[0]['cpu_min']:.1f} min")
    top = max(ln.points, key=lambda p: p["gap"])
    return [setting_label(ln.run.setting), ln.label, f"{ln.run.recon_min:.1f}" if ln.run.form else "–",
            f"{_gap(best)} at {best['cpu_min']:.1f}" if best else "–", verdict,
            f"{_gap(top)} at {top['cpu_min']:.1f}",
            f"{reach:.1f}" if reach is not None else f"not within {ln.points[-1]['cpu_min']:.1f}",
            against_e2e(c, ln, i) if i is not None else "–"]


def recovery_table(c: Campaign, drawn: list[Line]) -> list[str]:
    """The section from :func:`lines`'s ``drawn``."""
    if not drawn:
        return ["Not run yet: no chosen reconstruction or end-to-end curve with both reference evaluations and a gap "
                "to close (pruned worse than dense).", ""]
    head = ["Setting", "Run", "reconstruction CPU-min",
            f"highest gap closed ≤ {AT_MINUTES:g} CPU-min (%) [95 %] at CPU-min",
            f"{100 * TARGET:.0f} % within {AT_MINUTES:g} CPU-min", "highest gap closed (%) [95 %] at CPU-min",
            f"CPU-min to {100 * TARGET:.0f} %", "val PPL / SPP end to end's at that CPU-min [95 %]"]
    return [*markdown_table(head, [_row(c, ln) for ln in drawn], 2), ""]
