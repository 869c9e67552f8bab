"""What the report compares: each (setting, method)'s chosen rate on validation perplexity, its runs at that rate
(the seed-0 grid point and the extra seeds), and the closest competitor of SPP.

A rate is chosen on seed 0's validation perplexity, except where more seeds ran at two or more rates of the grid (the
runner-up's seeds, run where seed 0's choice looked like a lucky draw): then on the mean over the seeds those rates
share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lab.labels import adapters_in_table_order
from lab.recovery.records import SETTINGS, Campaign, TrainRun
from lab.recovery.selection import BASE_GRIDS, base_grid, settled_anchor
from lab.recovery.stats import PairedRatio, paired_ratio

REFERENCE = "spp"
"""Every method is compared against SPP."""


def val_ppl(run: TrainRun) -> float:
    """The selection value: merged WikiText-2 validation perplexity (``inf`` when absent or not finite)."""
    value = run.val.get("ppl") if run.val else None
    return float(value) if value is not None and math.isfinite(value) else math.inf


@dataclass(frozen=True)
class Choice:
    """One (setting, method): its grid (seed-0 runs, by rate), the chosen rate and its runs at that rate by seed."""

    setting: str
    method: str
    grid: tuple[TrainRun, ...]
    chosen: TrainRun
    runs: tuple[TrainRun, ...]
    base: tuple[float, ...] = ()
    """The base grid the runner ran (:func:`~lab.recovery.selection.base_grid`)."""
    by_rate: tuple[tuple[TrainRun, ...], ...] = ()
    """The runs at each grid rate that more seeds ran at (the chosen one among them), by seed."""
    selected_on: tuple[int, ...] = (0,)
    """The seeds whose mean validation perplexity chose the rate."""

    @property
    def interior(self) -> bool:
        """The chosen rate has a grid point on each side."""
        lrs = [r.lr for r in self.grid]
        return min(lrs) < self.chosen.lr < max(lrs)

    @property
    def grid_status(self) -> str:
        """``yes`` (interior), ``running: k of n base points`` (the base grid is not all there yet) or
        ``**no: endpoint**`` (a finished base grid chose an endpoint and its extension is missing)."""
        if self.interior:
            return "yes"
        done = sum(any(math.isclose(b, r.lr) for r in self.grid) for b in self.base)
        return f"running: {done} of {len(self.base)} base points" if done < len(self.base) else "**no: endpoint**"


def method_order(method: str) -> tuple[int, str]:
    """Table order: the registered methods' order, a distilled variant right after its method."""
    names = adapters_in_table_order()
    base, _, variant = method.partition("+")
    return (names.index(base) if base in names else len(names), variant)


def _rate_runs(c: Campaign, grid: list[TrainRun], seeds_kind: str) -> list[tuple[TrainRun, ...]]:
    """Each grid point with the extra seeds run at its rate, by seed."""
    out = []
    for g in grid:
        extra = [r for r in c.train if r.kind == seeds_kind and (r.setting, r.method) == (g.setting, g.method)
                 and math.isclose(r.lr, g.lr)]
        out.append(tuple(sorted([g, *extra], key=lambda r: r.seed)))
    return out


def select(by_rate: list[tuple[TrainRun, ...]]) -> tuple[tuple[TrainRun, ...], tuple[int, ...]]:
    """The chosen rate's runs and the seeds it was chosen on: the lowest mean validation perplexity over the seeds
    shared by every rate that ran more than seed 0 (when two or more did), else seed 0's; ties to the smaller
    rate."""
    seeded = [runs for runs in by_rate if len(runs) > 1]
    common = sorted(set.intersection(*({r.seed for r in runs} for runs in seeded))) if len(seeded) > 1 else []
    if len(common) < 2:
        return min(by_rate, key=lambda runs: (val_ppl(runs[0]), runs[0].lr)), (0,)

    def mean(runs: tuple[TrainRun, ...]) -> float:
        return sum(val_ppl(r) for r in runs if r.seed in common) / len(common)
    return min(seeded, key=lambda runs: (mean(runs), runs[0].lr)), tuple(common)


def choices(c: Campaign, kind: str = "grid", seeds_kind: str = "seeds") -> dict[tuple[str, str], Choice]:
    """Every (setting, method) with a grid under ``kind``, in table order, its rate chosen by :func:`select`."""
    grids: dict[tuple[str, str], list[TrainRun]] = {}
    for r in c.train:
        if r.kind == kind:
            grids.setdefault((r.setting, r.method), []).append(r)
    out = {}
    for (setting, method), grid in grids.items():
        grid.sort(key=lambda r: r.lr)
        by_rate = _rate_runs(c, grid, seeds_kind)
        runs, selected_on = select(by_rate)
        chosen = next(r for r in runs if r.kind == kind)
        base = base_grid(method, settled_anchor(c.root, setting, method)) if method in BASE_GRIDS else ()
        out[(setting, method)] = Choice(setting, method, tuple(grid), chosen, runs, tuple(float(lr) for lr in base),
                                        tuple(r for r in by_rate if len(r) > 1), selected_on)
    order = list(SETTINGS)
    return dict(sorted(out.items(), key=lambda kv: (order.index(kv[0][0]) if kv[0][0] in order else len(order),
                                                    method_order(kv[0][1]))))


def closest_competitor(chosen: dict[tuple[str, str], Choice], setting: str) -> str | None:
    """The method other than SPP (and not distilled) with the lowest seed-0 validation perplexity in ``setting``:
    chosen on validation data, like the rates."""
    rivals = [ch for (s, m), ch in chosen.items() if s == setting and m != REFERENCE and "+" not in m]
    return min(rivals, key=lambda ch: val_ppl(ch.chosen)).method if rivals else None


def against_reference(chosen: dict[tuple[str, str], Choice]) -> list[tuple[Choice, list[int], PairedRatio]]:
    """Every method against SPP of the same setting on the test windows, over the seeds both ran (the two-level
    paired bootstrap of :mod:`~lab.recovery.stats`)."""
    out = []
    for (setting, method), ch in chosen.items():
        ref = chosen.get((setting, REFERENCE))
        pair = paired_runs(ch.runs, ref.runs) if method != REFERENCE and ref is not None else None
        if pair is not None:
            out.append((ch, *pair))
    return out


def paired_runs(a: Sequence[TrainRun], b: Sequence[TrainRun]) -> tuple[list[int], PairedRatio] | None:
    """``a``'s test perplexity over ``b``'s on the seeds both ran (``None`` when they share none)."""
    ta, tb = {r.seed: r.test for r in a}, {r.seed: r.test for r in b}
    seeds = sorted(ta.keys() & tb.keys())
    return (seeds, paired_ratio([ta[s] for s in seeds], [tb[s] for s in seeds])) if seeds else None
