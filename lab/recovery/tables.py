"""The Markdown report of the recovery study, regenerated from the raw run files alone
(``python -m lab.recovery report experiments/results/runs/recovery --out
experiments/results/recovery_smollm2_135m.md``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from lab.collect_summaries import markdown_table
from lab.recovery.choices import (
    REFERENCE,
    Choice,
    against_reference,
    choices,
    closest_competitor,
    val_ppl,
)
from lab.recovery.coverage import coverage_lines
from lab.recovery.distillation import distillation_table
from lab.recovery.fresh_records import fresh_records_table
from lab.recovery.labels import cpu_capabilities, interval_text, method_label, rate, setting_label, verdict
from lab.recovery.reconstruction_rows import reconstruction_section
from lab.recovery.records import TEST_SOURCE, VAL_SOURCE, Campaign, cpu_name, load
from lab.recovery.recovery import curves, recovery_table
from lab.recovery.recovery_machines import machine_check_table
from lab.recovery.seed_selection import seed_selection_table
from lab.recovery.stats import gap_closed_per_seed
from lab.recovery.zero_shot import zero_shot_table
from spp.eval.perplexity import gap_closed
from spp.report_text import ppl_with_interval

COMMAND = ("python -m lab.recovery report experiments/results/runs/recovery "
           "--out experiments/results/recovery_smollm2_135m.md")


def _spread(values: Sequence[float], digits: int) -> str:
    """One value, or ``mean ± sample std`` of several."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def grid_table(chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """Per (setting, method): merged validation perplexity at every rate of its grid, the chosen one in bold."""
    rows = []
    for ch in chosen.values():
        cells = [f"{rate(r.lr)}: " + (f"**{val_ppl(r):.2f}**" if r is ch.chosen else f"{val_ppl(r):.2f}")
                 for r in ch.grid]
        rows.append([setting_label(ch.setting), method_label(ch.method), ", ".join(cells), rate(ch.chosen.lr),
                     ch.grid_status])
    return markdown_table(["Setting", "Method", "lr: merged val PPL (seed 0)", "chosen lr", "interior"], rows, 3)


def _reference_rows(c: Campaign, setting: str) -> list[list[str]]:
    """The dense and pruned rows of a setting from the ``eval.py`` reference runs."""
    rows = []
    for ev in c.evals:
        if ev.kind == "reference" and ev.setting in (setting, "dense"):
            test, val = ev.ppl.get(TEST_SOURCE), ev.ppl.get(VAL_SOURCE)
            rows.append([setting_label(setting), ev.method, "–", "–", f"{val['ppl']:.2f}" if val else "–",
                         ppl_with_interval(test) if test else "–", "–", "–", "–", "–"])
    return sorted(rows, key=lambda r: r[1] != "dense")


def _gap_interval(dense: dict, pruned: dict, merged: dict) -> str:
    """One seed's gap closed (%) with its paired bootstrap interval over windows."""
    g = gap_closed(dense, pruned, merged)
    return f"{100 * g['gap_closed']:.1f} [{100 * g['gap_closed_low']:.1f}, {100 * g['gap_closed_high']:.1f}]"


def _method_row(ch: Choice) -> list[str]:
    """One method at its chosen rate: test PPL and gap closed with their interval (one seed) or spread (several)."""
    runs = ch.runs
    tests = [r.test for r in runs]
    test = ppl_with_interval(tests[0]) if len(runs) == 1 else _spread([t["ppl"] for t in tests], 2)
    dense, pruned = runs[0].dense_test, runs[0].pruned_test
    gap = "–"
    if dense and pruned:
        gaps = [100 * g for g in gap_closed_per_seed(dense, pruned, tests)]
        gap = _gap_interval(dense, pruned, tests[0]) if len(runs) == 1 else _spread(gaps, 1)
    steps = [r.train_s / r.steps for r in runs if r.train_s and r.steps]
    losses = [r.alpaca_val for r in runs if r.alpaca_val is not None]
    return [setting_label(ch.setting), method_label(ch.method), rate(ch.chosen.lr), ",".join(str(r.seed) for r in runs),
            _selection_value(ch), test, gap, _spread(losses, 3) if losses else "–",
            _spread(steps, 1) if steps else "–", f"{ch.chosen.trained:,}"]


def _selection_value(ch: Choice) -> str:
    """The validation perplexity that chose the rate: seed 0's, or the mean over the seeds it was chosen on."""
    if ch.selected_on == (0,):
        return f"{val_ppl(ch.chosen):.2f}"
    vals = [val_ppl(r) for r in ch.runs if r.seed in ch.selected_on]
    return f"{statistics.mean(vals):.2f} (mean, seeds {','.join(map(str, ch.selected_on))})"


def main_table(c: Campaign, chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """Per setting: dense and pruned, then each method at its chosen rate over its seeds."""
    head = ["Setting", "Method", "lr (val. PPL)", "Seeds", "val PPL (selection)", "test PPL", "Gap closed, test (%)",
            "Alpaca val loss", "s / step", "Trainable"]
    rows: list[list[str]] = []
    for setting in dict.fromkeys(s for s, _ in chosen):
        rows += _reference_rows(c, setting)
        rows += [_method_row(ch) for (s, _), ch in chosen.items() if s == setting]
    return markdown_table(head, rows, 2)


def paired_table(chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """Every method against SPP of the same setting on the test windows, paired by seed: the small-sample interval
    the verdict uses (2 to 9 seeds) beside the two-level bootstrap."""
    head = ["Setting", "Method vs SPP", "Seeds", "test PPL ratio method / SPP", "[95 % small-sample t] (verdict)",
            "[95 % bootstrap]", "per seed", "Verdict", "CPU (both)"]
    rows = [[setting_label(ch.setting), method_label(ch.method), ",".join(map(str, seeds)), f"{p.ratio:.3f}",
             interval_text(p.t_low, p.t_high), interval_text(p.low, p.high), ", ".join(f"{v:.3f}" for v in p.per_seed),
             verdict(p.interval[1], p.interval[0], len(seeds)),
             cpu_capabilities([r for r in (*ch.runs, *chosen[(ch.setting, REFERENCE)].runs) if r.seed in seeds])]
            for ch, seeds, p in against_reference(chosen)]
    mixed = ("A CPU column naming two kinds: some seeds of the pair ran on one, the others on the other; both runs "
             "of a seed ran on the same kind, so every per-seed ratio is within one machine, but the seeds added "
             "later change machine together with seed. " if any(" + " in r[-1] for r in rows) else "")
    return [*markdown_table(head, rows, 3), "", mixed + INTERVAL_NOTE, ""]


MAIN_TABLE_NOTE = (
    "Interval method: one seed -> `ppl [95 % percentile bootstrap over the 40 test windows]` and gap closed with its "
    "paired bootstrap over the windows (the seed's own variation is not in it); several seeds -> mean ± sample std "
    "over seeds, no interval. Methods are compared in the paired table below, not by these columns.")

INTERVAL_NOTE = (
    "Interval method: with 2 to 9 seeds the verdict uses the small-sample interval, log ratio ± t(0.975, n − 1) · "
    "√(var of the per-seed log ratios / n + var of the per-window log ratios averaged over seeds / W), W = 40 "
    "windows — Student's t with n − 1 = 2 degrees of freedom at 3 seeds (t = 4.303) on the seed-to-seed spread, "
    "with the shared windows' sampling variance added (`lab/recovery/stats.py`); the two-level percentile bootstrap "
    "over seeds and windows (2,000 resamples) is shown beside it. One seed: the bootstrap over windows only, which "
    "names no winner. A verdict names a difference only when its interval excludes 1; otherwise the pair is a tie.")


def _lowest(group: dict[str, Choice]) -> tuple[list[int], str, float]:
    """The seeds every method of ``group`` has, and the method with the lowest mean test PPL over them."""
    common = sorted(set.intersection(*({r.seed for r in ch.runs} for ch in group.values())))
    mean = {m: statistics.mean(r.test["ppl"] for r in ch.runs if r.seed in common) for m, ch in group.items()}
    best = min(mean, key=mean.__getitem__)
    return common, best, mean[best]


def winners(chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """Per setting: the lowest mean test perplexity over the seeds every method has (a 3-seed mean beside a 1-seed
    value would compare seeds, not methods), then over SPP's and its closest competitor's seeds where those are
    more (the paired table says whether that difference is distinguishable)."""
    lines = []
    for setting in dict.fromkeys(s for s, _ in chosen):
        group = {m: ch for (s, m), ch in chosen.items() if s == setting}
        common, best, value = _lowest(group)
        rival = closest_competitor(chosen, setting)
        line = (f"- {setting_label(setting)}: lowest mean test PPL on the seeds every method has "
                f"({','.join(map(str, common))}) **{method_label(best)}** ({value:.2f}); SPP's closest "
                f"competitor on validation PPL: {method_label(rival) if rival else '–'}")
        pair = {m: group[m] for m in (REFERENCE, rival) if m in group}
        seeds, pbest, pvalue = _lowest(pair) if len(pair) == 2 else (common, best, value)
        if len(seeds) > len(common):
            line += (f"; of these two on seeds {','.join(map(str, seeds))}: **{method_label(pbest)}** "
                     f"({pvalue:.2f}, see the paired table)")
        lines.append(line + ".")
    return lines


def cost_lines(c: Campaign) -> list[str]:
    """Job time spent (one thread per job) and the CPUs the runs ran on."""
    train_h = sum(r.total_s for r in c.train if r.total_s) / 3600
    eval_h = sum(e.total_s for e in c.evals if e.total_s) / 3600
    cpus = sorted({cpu_name(m) for m in [r.machine for r in c.train] + [e.machine for e in c.evals] if m})
    return [f"Runs: {len(c.train)} training (`train.py`), {len(c.evals)} evaluation (`eval.py`); "
            f"{train_h + eval_h:.1f} job-hours at one thread each ({train_h:.1f} training, {eval_h:.1f} evaluation; "
            "two jobs side by side on 2 cores). "
            f"CPUs recorded (`machine.json`): {'; '.join(cpus) if cpus else 'none'}."]


def report(root: str | Path) -> str:
    """The whole report of the campaign under ``root``."""
    c = load(root)
    chosen, drawn = choices(c), curves(c)
    parts = ["# Recovery study: learning rates per setting on validation perplexity, seeds, paired comparisons", "",
             f"Command: `{COMMAND}`", "", *cost_lines(c), "",
             "## Learning-rate grids (selected on the merged model's WikiText-2 validation perplexity)", "",
             *grid_table(chosen), "", "## Results at the chosen rates (WikiText-2 test)", "",
             *main_table(c, chosen), "", MAIN_TABLE_NOTE, "", *winners(chosen), "",
             "## Each method against SPP (same pruned model, seeds and test windows)", "", *paired_table(chosen),
             *coverage_lines(Path(root)), *reconstruction_section(root, chosen), *seed_selection_table(chosen),
             *zero_shot_table(c, chosen), *distillation_table(c, chosen), *recovery_table(c, drawn),
             *fresh_records_table(c),
             *machine_check_table(c, drawn), *notes()]
    return "\n".join(parts)


def notes() -> list[str]:
    """The closing paragraph: the protocol and how each column was computed."""
    return ["## How to read it", "",
            "Every training run: SmolLM2-135M, 540 Alpaca records (500 train = 63 steps of 8, 40 validation), one "
            "epoch, perplexity on 40 systematic windows of 512 tokens of the WikiText-2 validation (selection) and "
            "test (claims) splits. val PPL (selection) = merged model, seed 0's grid point, or the mean over seeds "
            "where the rate was chosen on it (the rate-choice table). test PPL: one seed -> "
            "`ppl [95 % bootstrap interval over windows]`, several -> mean ± sample std over seeds. Gap closed = "
            "(log PPL pruned − log PPL) / (log PPL pruned − log PPL dense), one seed with its paired bootstrap "
            "interval over windows. Paired ratios: per-window NLL differences; with 2 to 9 seeds the verdict's "
            "interval is the small-sample t interval (the paired table's note), with one seed the bootstrap over "
            "windows; the two-level percentile bootstrap over seeds and windows (2,000 resamples, "
            "`lab/recovery/stats.py`) is shown beside it; a verdict names a difference only when its interval "
            "excludes 1. CPU = torch's CPU capability recorded by the pair's runs (float32 results differ in the 4th "
            "digit between AVX2 and AVX-512).",
            ""]
