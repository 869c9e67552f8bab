"""How each rate was chosen: on seed 0, or on the mean over seeds where the runner-up rate ran more seeds
(:func:`lab.recovery.choices.select`); the chosen rate's validation perplexity on every seed beside the runner-up's,
so a lucky pick of seed 0 shows."""

from __future__ import annotations

import statistics

from lab.collect_summaries import markdown_table
from lab.recovery.choices import Choice, val_ppl
from lab.recovery.labels import method_label, rate, setting_label
from lab.recovery.records import TrainRun


def _per_seed(runs: tuple[TrainRun, ...]) -> str:
    return ", ".join(f"s{r.seed} {val_ppl(r):.2f}" for r in runs)


def _runner_up(ch: Choice) -> tuple[TrainRun, ...] | None:
    """The other rate with the most seeds, then the lowest mean validation perplexity: its runs by seed."""
    seeded = {runs[0].lr: runs for runs in ch.by_rate}
    others = [seeded.get(r.lr, (r,)) for r in ch.grid if r.lr != ch.chosen.lr]
    rank = sorted(others, key=lambda runs: (-len(runs), statistics.mean(val_ppl(r) for r in runs), runs[0].lr))
    return rank[0] if rank else None


def _row(ch: Choice) -> list[str] | None:
    runner = _runner_up(ch)
    if len(ch.runs) < 2 or runner is None:
        return None
    mean = statistics.mean(val_ppl(r) for r in ch.runs)
    runner_mean = statistics.mean(val_ppl(r) for r in runner)
    on = "seed 0" if ch.selected_on == (0,) else "mean of seeds " + ",".join(map(str, ch.selected_on))
    seed0_pick = min(ch.grid, key=lambda r: (val_ppl(r), r.lr)).lr
    flag = "**yes**" if mean > runner_mean and len(runner) == 1 else "no"
    return [setting_label(ch.setting), method_label(ch.method), rate(ch.chosen.lr), on,
            "same" if seed0_pick == ch.chosen.lr else f"**{rate(seed0_pick)}**", _per_seed(ch.runs), f"{mean:.2f}",
            f"{rate(runner[0].lr)}: {_per_seed(runner)}", f"{runner_mean:.2f}", flag]


def seed_selection_table(chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """Per (setting, method) with more than one seed: how its rate was chosen, validation PPL per seed at the chosen
    rate and at the runner-up, and whether the runner-up's seed 0 alone beats the chosen rate's mean (a pick that
    more seeds at the runner-up would have to settle)."""
    rows = [row for ch in chosen.values() if (row := _row(ch)) is not None]
    if not rows:
        return []
    head = ["Setting", "Method", "chosen lr", "chosen on", "seed 0 alone would choose",
            "val PPL per seed at the chosen lr", "mean", "runner-up lr: val PPL per seed", "mean",
            "runner-up's seed 0 below the chosen mean, runner-up not seeded"]
    return ["## How each rate was chosen, checked on the other seeds (WikiText-2 validation)", "",
            *markdown_table(head, rows, 4), "",
            "Each rate is chosen on seed 0's validation perplexity, except where the runner-up rate also ran more "
            "seeds (`experiments/recovery/run.sh` `rate_seeds`): there on the mean over the seeds both rates ran. "
            "A **yes** in the last column marks a seed-0 pick the other seeds do not support and whose runner-up "
            "has no seeds to settle it.", ""]
