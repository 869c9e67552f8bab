"""The same recovery run on two machines (``recovery/<method>`` and ``recovery_check/<method>``: same seed, data and
rate): how much CPU time the second machine took for the same steps, and whether the two curves' perplexities agree.
The recovery table reads each method against SPP on its own machine; this section says how far CPU minutes of the two
machines differ."""

from __future__ import annotations

from lab.collect_summaries import markdown_table
from lab.recovery.labels import method_label, setting_label
from lab.recovery.records import Campaign, TrainRun
from lab.recovery.recovery import (
    AT_MINUTES,
    at_minutes,
    machine_key,
    machine_letters,
    recovery_runs,
)


def check_pairs(c: Campaign) -> list[tuple[TrainRun, TrainRun]]:
    """(first run, re-run) of every (setting, method) that has both."""
    runs = recovery_runs(c)
    return [(a, b) for a in runs if a.kind == "recovery" for b in runs
            if b.kind == "recovery_check" and (b.setting, b.method) == (a.setting, a.method)]


def cpu_ratios(first: TrainRun, again: TrainRun) -> list[float]:
    """The re-run's training CPU time over the first run's, at every step both measured (step 0 left out)."""
    at = {p["step"]: p["train_cpu_s"] for p in first.curve}
    return [p["train_cpu_s"] / at[p["step"]] for p in again.curve if at.get(p["step"])]


def largest_ppl_difference(first: TrainRun, again: TrainRun) -> float:
    """The largest relative difference of the validation perplexities the two runs measured at the same step."""
    at = {p["step"]: p["ppl"] for p in first.curve}
    return max((abs(p["ppl"] / at[p["step"]] - 1.0) for p in again.curve if p["step"] in at), default=float("nan"))


def machine_check_table(c: Campaign, drawn: list[tuple[TrainRun, list[dict[str, float]]]]) -> list[str]:
    """The section, from :func:`~lab.recovery.recovery.curves`'s ``drawn`` (empty until a method has
    both runs)."""
    letters, gap = machine_letters(c), {r.rel: at_minutes(pts, AT_MINUTES) for r, pts in drawn}
    rows = []
    for a, b in check_pairs(c):
        ratios = cpu_ratios(a, b)
        reads = [f"{100 * gap[r.rel]['gap']:.1f}" if gap.get(r.rel) else "past the run" for r in (a, b)]
        rows.append([setting_label(a.setting), method_label(a.method),
                     f"{letters[machine_key(a)]} → {letters[machine_key(b)]}",
                     f"{a.curve[-1]['train_cpu_s'] / 60:.1f} → {b.curve[-1]['train_cpu_s'] / 60:.1f}",
                     f"{ratios[-1]:.3f} ({min(ratios):.3f}–{max(ratios):.3f})" if ratios else "–",
                     f"{100 * largest_ppl_difference(a, b):.2g}", " → ".join(reads)])
    if not rows:
        return []
    head = ["Setting", "Method", "CPU", "training CPU-min, all steps", "CPU time ratio re-run / first (per point)",
            "largest val PPL difference (%)", f"gap closed at {AT_MINUTES:g} CPU-min (%)"]
    return ["## The same recovery run on two CPUs", "", *markdown_table(head, rows, 3), "",
            "The re-run repeats the first run (seed, data, rate, steps) on another machine. CPU time ratio: the "
            "re-run's training CPU time over the first run's at the last step (in brackets: its range over the "
            "measured steps). Largest val PPL difference: over the steps both measured. CPU minutes compare within "
            "one CPU only: the recovery table reads each method against SPP on the same CPU.", ""]
