"""Rates chosen on seed 0: each chosen rate's validation perplexity on every seed, beside the runner-up rate's seed 0,
so a lucky pick (the chosen rate's other seeds worse than the runner-up) shows."""

from __future__ import annotations

import statistics

from lab.collect_summaries import markdown_table
from lab.recovery.choices import Choice, val_ppl
from lab.recovery.labels import method_label, rate, setting_label


def _runner_up(ch: Choice) -> tuple[str, float] | None:
    """The grid's second-lowest seed-0 validation perplexity: (rate, value)."""
    rest = sorted((r for r in ch.grid if r is not ch.chosen), key=lambda r: (val_ppl(r), r.lr))
    return (rate(rest[0].lr), val_ppl(rest[0])) if rest else None


def seed_selection_table(chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """Per (setting, method) with more than one seed: validation PPL per seed at the chosen rate, their mean, the
    runner-up rate's seed 0, and whether the chosen rate's mean over seeds is above it."""
    rows = []
    for ch in chosen.values():
        runner = _runner_up(ch)
        if len(ch.runs) < 2 or runner is None:
            continue
        vals = [val_ppl(r) for r in ch.runs]
        mean = statistics.mean(vals)
        rows.append([setting_label(ch.setting), method_label(ch.method), rate(ch.chosen.lr),
                     ", ".join(f"s{r.seed} {v:.2f}" for r, v in zip(ch.runs, vals, strict=True)), f"{mean:.2f}",
                     f"{runner[0]}: {runner[1]:.2f}", "**yes**" if mean > runner[1] else "no"])
    if not rows:
        return []
    head = ["Setting", "Method", "chosen lr", "val PPL per seed at the chosen lr", "mean", "runner-up lr: val PPL "
            "(seed 0 only)", "chosen lr's seed mean above the runner-up's seed 0"]
    return ["## Rates chosen on seed 0, checked on the other seeds (WikiText-2 validation)", "",
            *markdown_table(head, rows, 3), "",
            "Each rate was chosen on seed 0 alone; the other seeds ran at the chosen rate only, so the runner-up "
            "rate has seed 0 only. Where the chosen rate's mean over seeds is above the runner-up's seed 0, the "
            "choice may be a lucky draw of seed 0 and the chosen setting's test spread over seeds reflects it; "
            "choosing on the mean over seeds at both rates would need the runner-up's seeds (not run).", ""]
