"""The Markdown report of the block-wise reconstruction campaign, regenerated from the raw run files alone
(``python -m lab.reconstruction report experiments/results/runs/reconstruction --out
experiments/results/reconstruction_smollm2_135m.md``). A partial campaign reports what finished and says "not run"
for the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.collect_summaries import markdown_table
from lab.reconstruction.grids import choices, grid_tables, order, seeded, val_ppl, within_budget
from lab.reconstruction.records import TEST_SOURCE, Campaign, Run, load
from lab.reconstruction.recovery import (
    AT_MINUTES,
    TARGET,
    Line,
    against_e2e,
    describe,
    gap,
    lines,
    raw_points,
    recovery_table,
)
from lab.reconstruction.seeds import seeds_table
from lab.recovery.labels import rate, setting_label
from lab.recovery.records import cpu_name
from spp.eval.perplexity import paired_difference
from spp.report_text import ppl_with_interval

COMMAND = ("python -m lab.reconstruction report experiments/results/runs/reconstruction "
           "--out experiments/results/reconstruction_smollm2_135m.md")


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    """``ppl_a / ppl_b [95 %]`` paired over the windows; ``–`` when either is missing."""
    if not a or not b:
        return "–"
    try:
        d = paired_difference(a, b)
    except ValueError:  # not on the same windows
        return "–"
    return f"{d['ppl_ratio']:.3f} [{d['ppl_ratio_low']:.3f}, {d['ppl_ratio_high']:.3f}]"


def cpu_minutes(run: Run) -> float:
    """The run's training CPU minutes: its reconstruction plus, with a curve, its end-to-end training."""
    raw = raw_points(run)
    return raw[-1]["train_cpu_s"] / 60.0 if run.curve and raw else run.recon_min


def test_rows(c: Campaign, drawn: list[Line]) -> list[list[str]]:
    """Dense and pruned per setting, then each chosen reconstruction and each curve run, on the test windows."""
    at_same = {ln.run.rel: ln for ln in drawn}
    runs = [ch.chosen for ch in choices(c)] + within_budget(c, AT_MINUTES)
    runs += [r for r in c.runs if r.kind in ("e2e", "then_e2e")]
    rows = []
    settings = {r.setting for r in runs} | {r.setting for r in c.refs if r.setting != "dense"}
    for setting in sorted(settings, key=lambda s: order(s, None)):
        ref = c.reference(setting, TEST_SOURCE)
        for name, entry in zip(("dense", "pruned"), ref or (), strict=False):
            rows.append([setting_label(setting), name, "–", "–", ppl_with_interval(entry), "–", "–", "–", "–"])
        e2e = next((r for r in c.runs if r.kind == "e2e" and r.setting == setting), None)
        for run in sorted((r for r in runs if r.setting == setting),
                          key=lambda r: (r.kind == "e2e", r.kind == "then_e2e", *order(r.setting, r.form))):
            g = gap(run.dense_test, run.pruned_test, run.test)
            ln = at_same.get(run.rel)
            same = "–"
            if ln is not None and not run.curve:
                same = against_e2e(c, ln, 0)
            rows.append([setting_label(setting), describe(run), f"{cpu_minutes(run):.1f}",
                         f"{val_ppl(run):.2f}" if run.val else "–", ppl_with_interval(run.test),
                         f"{100 * g['gap_closed']:.1f} [{100 * g['gap_closed_low']:.1f}, "
                         f"{100 * g['gap_closed_high']:.1f}]" if g else "–",
                         _ratio(run.test, run.pruned_test), same,
                         _ratio(run.test, e2e.test) if e2e is not None and run is not e2e else "–"])
    return rows


def test_table(c: Campaign, drawn: list[Line]) -> list[str]:
    """The test-perplexity table and the best two on validation."""
    rows = test_rows(c, drawn)
    if not rows:
        return ["Not run yet: no chosen reconstruction, end-to-end run or reference evaluation.", ""]
    head = ["Setting", "Run", "training CPU-min", "val PPL", "test PPL [95 % windows]", "gap closed, test (%) [95 %]",
            "test PPL / pruned [95 %]", "val PPL / SPP end to end's at the same CPU-min [95 %]",
            "test PPL / SPP end to end's, final [95 %]"]
    out = [*markdown_table(head, rows, 2), ""]
    graded = [ch for ch in choices(c) if ch.chosen.kind != "check"]  # a shorter check has no grid to rank
    for setting in sorted({ch.setting for ch in graded}, key=lambda s: order(s, None)):
        ranked = sorted((ch for ch in graded if ch.setting == setting), key=lambda ch: val_ppl(ch.chosen))
        out.append(f"- {setting_label(setting)}: best two on validation PPL (the runner's `seeds` step): "
                   + "; ".join(f"{describe(ch.chosen)} ({val_ppl(ch.chosen):.2f})" for ch in ranked[:2]) + ".")
    return [*out, ""]


def machine_table(c: Campaign) -> list[str]:
    """The machines: per CPU the jobs' threads, cores, torch and the 1-minute load at their start and end."""
    jobs = [(r.machine, r.rel) for r in c.runs] + [(r.machine, r.rel) for r in c.refs]
    rows = []
    for cpu in sorted({cpu_name(m) for m, _ in jobs if m}):
        ms = [m for m, _ in jobs if m and cpu_name(m) == cpu]

        def span(key: str, ms: list[dict[str, Any]] = ms) -> str:
            values = [m[key] for m in ms if m.get(key) is not None]
            return f"{min(values):.2f}–{max(values):.2f}" if values else "–"

        rows.append([cpu, str(len(ms)), ",".join(sorted({str(m.get("omp_num_threads", "?")) for m in ms})),
                     ",".join(sorted({str(m.get("cores", "?")) for m in ms})),
                     ",".join(sorted({str(m.get("torch", "?")) for m in ms})), span("load_1m_start"),
                     span("load_1m_end")])
    missing = sum(1 for m, _ in jobs if not m)
    if not rows:
        return ["No `machine.json` yet.", ""]
    head = ["CPU (torch capability)", "jobs", "threads (OMP)", "cores", "torch", "1-min load at start",
            "1-min load at end"]
    return [*markdown_table(head, rows, 1), "",
            f"From each finished job's `machine.json`; {missing} finished job(s) without one.", ""]


def status_lines(c: Campaign) -> list[str]:
    """How many jobs finished, their job-hours, and those running or failed."""
    hours = (sum(r.total_s or 0.0 for r in c.runs) + sum(r.total_s or 0.0 for r in c.refs)) / 3600
    kinds = {k: sum(r.kind == k for r in c.runs) for k in ("grid", "epochs", "seeds", "e2e", "then_e2e", "check")}
    out = [f"Finished: {len(c.refs)} reference evaluations (`eval.py`), "
           + ", ".join(f"{n} {k}" for k, n in kinds.items()) + f" training jobs (`train.py`); {hours:.1f} job-hours "
           "at one thread each (two jobs side by side on 2 cores)."]
    if c.pending:
        out.append("Not finished: " + ", ".join(f"`{rel}` ({state})" for rel, state in c.pending.items()) + ".")
    return [*out, ""]


def report(root: str | Path) -> str:
    """The whole report of the campaign under ``root``."""
    c = load(root)
    drawn = lines(c)
    parts = ["# Block-wise reconstruction on SmolLM2-135M: what recovers the pruned model per CPU-minute", "",
             f"Command: `{COMMAND}`", "", *status_lines(c),
             "## Grids (chosen on the merged model's WikiText-2 validation perplexity)", "", *grid_tables(c),
             f"## Recovery per CPU-minute (WikiText-2 validation windows; goal {100 * TARGET:.0f} % of the log gap "
             f"within {AT_MINUTES:g} CPU-min)", "", *recovery_table(c, drawn),
             "## Test perplexity of the chosen settings", "", *test_table(c, drawn),
             "## Seeds", "", *seeds_table(seeded(c)), "## Machine", "", *machine_table(c), *notes()]
    return "\n".join(parts)


def notes() -> list[str]:
    """How each column was computed."""
    return ["## How to read it", "",
            "Every job: SmolLM2-135M pruned on 32 C4 windows of 512 tokens; a reconstruction trains on its own 32 C4 "
            "windows of 512 tokens; perplexity on 40 systematic windows of 512 tokens of the WikiText-2 validation "
            "(selection, recovery curves) and test (claims) splits. Grids: merged validation PPL of each seed-0 point, "
            f"the chosen one in bold; a chosen endpoint names the rate that would extend the grid. A form's chosen "
            "setting is its lowest validation PPL over its rate and epochs grids; where that took more than "
            f"{AT_MINUTES:g} CPU-min, the form's lowest validation PPL within {AT_MINUTES:g} CPU-min is listed too. "
            "Training CPU-min: process CPU time at one thread of the reconstruction "
            "(`reconstruction.timings.cpu_seconds`, the original run's on a cache hit) plus, for end-to-end "
            "training, its training steps (`train_cpu_s`), not the evaluations. Gap "
            "closed = (log PPL pruned − log PPL) / (log PPL pruned − log PPL dense); dense and pruned from "
            "`reference/` on validation, from the job itself on test. Intervals: paired percentile bootstrap over "
            "the 40 windows (2,000 resamples); comparisons with SPP end to end at the same CPU-min interpolate each "
            f"window's NLL linearly between its curve's points (validation only: the curve measures no test "
            f"windows). {100 * TARGET:.0f} % within {AT_MINUTES:g} CPU-min: the interpolated crossing of the measured "
            "points; \"points short\" is measured from the highest measured point within the budget. Rates written "
            f"as the runner's directories ({rate(0.03)} = 0.03).", ""]
