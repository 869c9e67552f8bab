"""Records seen once against a repeated epoch: a method's run of about as many steps on twice the records, each
seen once (``fresh/<setting>/<method>``, ``experiments/recovery/run.sh`` ``fresh``), read beside its two-epoch recovery
run at the steps both measured. If the repeated run's fall in its second epoch came from repetition, the fresh run
does not fall; if it came from training longer at that rate, it falls too."""

from __future__ import annotations

from typing import Any

from lab.collect_summaries import markdown_table
from lab.recovery.labels import method_label, setting_label
from lab.recovery.records import Campaign, TrainRun
from lab.recovery.recovery import curve, machine_key, recovery_runs, reference_val
from spp.eval.perplexity import gap_closed, paired_difference

KIND = "fresh"


def fresh_runs(c: Campaign) -> list[TrainRun]:
    """The fresh-records runs with a curve."""
    return [r for r in c.train if r.kind == KIND and r.curve]


def repeated_of(c: Campaign, run: TrainRun) -> TrainRun | None:
    """The two-epoch recovery run of the same setting and method, the one on the same CPU preferred."""
    same = [r for r in recovery_runs(c) if (r.setting, r.method) == (run.setting, run.method)]
    return next((r for r in same if machine_key(r) == machine_key(run)), same[0] if same else None)


def _gap(point: dict[str, Any], ref: tuple[dict[str, Any], dict[str, Any]]) -> str:
    g = gap_closed(*ref, point)
    return f"{100 * g['gap_closed']:.1f} [{100 * g['gap_closed_low']:.1f}, {100 * g['gap_closed_high']:.1f}]"


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> str:
    d = paired_difference(a, b)
    return f"{d['ppl_ratio']:.3f} [{d['ppl_ratio_low']:.3f}, {d['ppl_ratio_high']:.3f}]"


def _rows(c: Campaign, run: TrainRun, rep: TrainRun) -> list[list[str]]:
    """One row per step both curves measured, then the two last points (their steps may differ by one)."""
    ref = reference_val(c, run.setting)
    by_step = {p["step"]: p for p in rep.curve}
    pairs = [(p, by_step[p["step"]]) for p in run.curve if p["step"] in by_step and p["step"] > 0]
    if run.curve[-1]["step"] not in by_step:
        pairs.append((run.curve[-1], rep.curve[-1]))
    return [[setting_label(run.setting), method_label(run.method),
             str(f["step"]) if f["step"] == r["step"] else f"{f['step']} / {r['step']}",
             _gap(f, ref), _gap(r, ref), _ratio(f, r)] for f, r in pairs]


def _peak_then_last(points: list[dict[str, float]]) -> str:
    peak = max(points, key=lambda p: p["gap"])
    last = points[-1]
    return (f"highest {100 * peak['gap']:.1f} % at step {peak['step']}, last {100 * last['gap']:.1f} % at step "
            f"{last['step']}")


def fresh_records_table(c: Campaign) -> list[str]:
    """The section (empty until a fresh-records run and its two-epoch counterpart exist)."""
    rows, lines = [], []
    for run in fresh_runs(c):
        rep, ref = repeated_of(c, run), reference_val(c, run.setting)
        if rep is None or ref is None:
            continue
        rows += _rows(c, run, rep)
        lines.append(f"- {setting_label(run.setting)}, {method_label(run.method)}: records seen once "
                     f"({run.steps} steps): {_peak_then_last(curve(run.curve, *ref))}; two epochs of the same 500 "
                     f"records ({rep.steps} steps): {_peak_then_last(curve(rep.curve, *ref))}.")
    if not rows:
        return []
    head = ["Setting", "Method", "step (once / repeated)", "gap closed, records seen once (%) [95 %]",
            "gap closed, two epochs (%) [95 %]", "val PPL once / two epochs [95 %]"]
    return ["## Records seen once against a repeated epoch (WikiText-2 validation windows)", "",
            *markdown_table(head, rows, 3), "", *lines, "",
            "Both runs: the same method, rate, seed and batch of 8; the two-epoch run trains on 500 records twice "
            "(126 steps), the other on 1,000 records once (`data.max_examples=1040`, 125 steps), the first 1,040 "
            "valid Alpaca records of the shipped sample split as the 540 of the other runs are (so up to step 64 "
            "the two runs see different orders and partly different records, not the same training). Intervals: "
            "paired bootstrap over the 40 validation windows (one run each: windows only, not seeds).", ""]
