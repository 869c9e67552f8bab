"""Seeds of the chosen reconstructions: a Student-t interval over seeds next to the window interval.

With ``n`` seeds of values ``x``, the interval is ``mean ± t(0.975, n − 1) · sd / √n`` (``sd`` the sample standard
deviation). With n = 3, t = 4.303: the interval is wide and rests on the seeds' spread being roughly normal.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from lab.collect_summaries import markdown_table
from lab.reconstruction.grids import Choice
from lab.reconstruction.records import Run
from lab.reconstruction.recovery import gap
from lab.recovery.labels import interval_text, method_label, rate, setting_label
from lab.recovery.stats import T_975, gap_closed_per_seed, paired_ratio


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the two-sided 95 % Student-t interval of the mean over ``values`` (2 to 11 values).

    Raises:
        ValueError: fewer than 2 or more than 11 values.
    """
    n = len(values)
    if not 2 <= n <= len(T_975) + 1:
        raise ValueError(f"t interval over {n} values: give 2 to {len(T_975) + 1}")
    mean = statistics.fmean(values)
    half = T_975[n - 2] * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def _t(values: Sequence[float], scale: float, digits: int) -> str:
    mean, low, high = t_interval([scale * v for v in values])
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def seed_row(ch: Choice) -> list[str] | None:
    """One chosen reconstruction over its seeds: test PPL and gap closed per seed, their t intervals over seeds,
    seed 0's window interval, and the ratio to the pruned model with the small-sample interval over seeds
    (:func:`lab.recovery.stats.seed_t_interval`) and the two-level (seeds × windows) bootstrap."""
    runs = ch.seeds
    tests = [r.test for r in runs]
    dense, pruned = runs[0].dense_test, runs[0].pruned_test
    gaps = gap_closed_per_seed(dense, pruned, tests)
    g0 = gap(dense, pruned, tests[0])
    if g0 is None:
        return None
    ratio = paired_ratio(tests, [pruned] * len(runs))
    return [setting_label(ch.setting), method_label(ch.form), rate(ch.chosen.lr), str(ch.chosen.epochs),
            ",".join(str(r.seed) for r in runs), ", ".join(f"{t['ppl']:.2f}" for t in tests),
            _t([t["ppl"] for t in tests], 1.0, 2), f"{tests[0]['ci_low']:.2f}–{tests[0]['ci_high']:.2f}",
            _t(gaps, 100.0, 1), f"{100 * g0['gap_closed_low']:.1f}–{100 * g0['gap_closed_high']:.1f}",
            f"{ratio.ratio:.3f} {interval_text(ratio.t_low, ratio.t_high)}", interval_text(ratio.low, ratio.high)]


def seeds_table(points: list[tuple[Choice, Run | None]]) -> list[str]:
    """Every point with more than one seed (the runner's ``seeds`` step: the best two), and whether it is still
    the form's chosen setting."""
    rows, with_seeds = [], {ch.chosen.rel for ch, _ in points if len(ch.seeds) > 1}
    for ch, chosen in points:
        row = seed_row(ch) if len(ch.seeds) > 1 else None
        if row is not None:
            its = "its seeds: in this table" if chosen is not None and chosen.rel in with_seeds else "its seed 0 only"
            now = ("yes" if chosen is None or chosen.rel == ch.chosen.rel
                   else f"**no: {chosen.epochs} ep. at lr {rate(chosen.lr)} ({its})**")
            rows.append([*row, now])
    if not rows:
        return ["Not run yet: no chosen reconstruction has a second seed (`seeds/`).", ""]
    head = ["Setting", "Form", "lr", "epochs", "seeds", "test PPL per seed", "mean [95 % t, seeds]",
            "seed 0 [95 % windows]", "gap closed, test (%) mean [95 % t, seeds]", "seed 0 [95 % windows]",
            "PPL / pruned [95 % small-sample t]", "[95 % seeds × windows bootstrap]", "the chosen setting"]
    ts = ", ".join(f"t(0.975, {n - 1}) = {T_975[n - 2]:.3f}" for n in sorted({len(ch.seeds) for ch, _ in points
                                                                                 if len(ch.seeds) > 1}))
    return [*markdown_table(head, rows, 2), "",
            f"Seeds: 0 is the grid point, the others `seeds/`. The t interval is mean ± t · sd / √n ({ts}): "
            "with n = 3 seeds it is wide and assumes roughly normal seed-to-seed variation; the window intervals "
            "cover one seed's windows only. PPL / pruned: the small-sample interval of the recovery study (Student's t "
            "with n − 1 degrees of freedom on the per-seed log ratios, the windows' sampling variance added; "
            "`lab/recovery/stats.py`, its coverage checked in `experiments/results/recovery_interval_coverage.json`), "
            "beside the two-level bootstrap over seeds and windows (too narrow with 3 seeds in that check). A point "
            "whose form's choice moved after its seeds ran (a grid that grew) says so in the last column.", ""]
