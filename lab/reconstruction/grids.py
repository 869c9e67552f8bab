"""Which reconstruction settings the campaign chose, on the merged model's WikiText-2 *validation* perplexity only: each
(setting, form, epochs) rate grid, the epochs grid at the rate chosen with 3 epochs, and per (setting, form) the
chosen point (the lowest validation perplexity over both) with its seeds."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lab.collect_summaries import markdown_table
from lab.reconstruction.records import Campaign, Run
from lab.reconstruction.selection import half_decade
from lab.recovery.labels import method_label, rate, setting_label
from lab.recovery.records import SETTINGS

BASE_RATES: dict[str, tuple[float, ...]] = {"spp": (3e-2, 1e-1, 3e-1), "masked_full": (3e-5, 1e-4, 3e-4),
                                            "norms": (3e-4, 1e-3, 3e-3)}
"""Each form's base rate grid, as ``rates()`` of ``experiments/reconstruction/run.sh`` writes it."""
OTHER_RATES = (1e-3, 1e-2, 1e-1)
EPOCHS_GRID = (1, 2, 3, 5)
"""The epochs the runner's ``epochs`` step runs (3 is the rate grid's)."""
FORM_ORDER = ("spp", "masked_full", "norms")


def val_ppl(run: Run) -> float:
    """The selection value: the merged model's validation perplexity (``inf`` when absent or not finite)."""
    value = run.val.get("ppl") if run.val else None
    return float(value) if value is not None and math.isfinite(value) else math.inf


def order(setting: str, form: str | None) -> tuple[int, int, str]:
    """Table order: settings as the recovery study lists them, then forms (SPP's first)."""
    names = list(SETTINGS)
    return (names.index(setting) if setting in names else len(names),
            FORM_ORDER.index(form) if form in FORM_ORDER else len(FORM_ORDER), form or "")


@dataclass(frozen=True)
class Grid:
    """One grid of seed-0 runs along ``axis`` (``lr`` or ``epochs``), sorted along it, and its chosen run."""

    setting: str
    form: str
    axis: str
    runs: tuple[Run, ...]
    expected: tuple[float, ...]

    @property
    def chosen(self) -> Run:
        """The run with the lowest validation perplexity."""
        return min(self.runs, key=val_ppl)

    def value(self, run: Run) -> float:
        """The run's place on the grid's axis."""
        return float(run.lr if self.axis == "lr" else run.epochs)

    @property
    def status(self) -> str:
        """``yes`` (the chosen point has a point on each side), ``running: k of n base points``, or ``no: endpoint``
        with the point that would extend it."""
        values = [self.value(r) for r in self.runs]
        best = self.value(self.chosen)
        if min(values) < best < max(values):
            return "yes"
        done = sum(any(math.isclose(v, e) for v in values) for e in self.expected)
        if done < len(self.expected):
            return f"not finished: {done} of {len(self.expected)} base points"
        if self.axis == "lr" and len(values) > 1:
            return f"**no: endpoint** (lr {rate(half_decade(best, up=best == max(values)))} not run)"
        return "**no: endpoint**"


def rate_grids(c: Campaign) -> list[Grid]:
    """Every (setting, form, epochs) rate grid under ``grid/``, in table order."""
    keys = sorted({(r.setting, r.form, r.epochs) for r in c.runs if r.kind == "grid"},
                  key=lambda k: (*order(k[0], k[1]), k[2]))
    return [Grid(s, f, "lr", tuple(sorted((r for r in c.runs if r.kind == "grid" and (r.setting, r.form, r.epochs)
                                           == (s, f, e)), key=lambda r: r.lr)), BASE_RATES.get(f, OTHER_RATES))
            for s, f, e in keys]


def epochs_grid(c: Campaign, at3: Grid) -> Grid:
    """The epochs grid at the rate ``at3`` (a 3-epoch rate grid) chose: its chosen run and ``epochs/`` runs there."""
    lr = at3.chosen.lr
    runs = [at3.chosen] + [r for r in c.runs if r.kind == "epochs" and (r.setting, r.form) == (at3.setting, at3.form)
                           and math.isclose(r.lr, lr) and r.epochs != 3]
    return Grid(at3.setting, at3.form, "epochs", tuple(sorted(runs, key=lambda r: r.epochs)), EPOCHS_GRID)


@dataclass(frozen=True)
class Choice:
    """A (setting, form)'s chosen reconstruction and its runs over seeds (seed 0 = the chosen grid point)."""

    setting: str
    form: str
    chosen: Run
    seeds: tuple[Run, ...]


def choices(c: Campaign) -> list[Choice]:
    """Per (setting, form): the seed-0 run of ``grid/`` and ``epochs/`` with the lowest validation perplexity, and
    the ``seeds/`` runs at its rate and epochs; at a setting with only a shorter check (``check/``), that run."""
    out = []
    for s, f in sorted({(r.setting, r.form) for r in c.runs if r.kind in ("grid", "check")}, key=lambda k: order(*k)):
        pool = [r for r in c.runs if r.kind in ("grid", "epochs") and (r.setting, r.form) == (s, f) and r.val]
        pool = pool or [r for r in c.runs if r.kind == "check" and (r.setting, r.form) == (s, f) and r.val]
        if not pool:
            continue
        best = min(pool, key=val_ppl)
        more = sorted((r for r in c.runs if r.kind == "seeds" and (r.setting, r.form, r.epochs) == (s, f, best.epochs)
                       and math.isclose(r.lr, best.lr) and r.seed != best.seed), key=lambda r: r.seed)
        out.append(Choice(s, f, best, (best, *more)))
    return out


def within_budget(c: Campaign, minutes: float) -> list[Run]:
    """Per graded (setting, form) whose chosen run took longer than ``minutes`` CPU-minutes: its lowest validation
    PPL among the ``grid/`` and ``epochs/`` runs that took at most ``minutes`` (the goal's budget)."""
    out = []
    for ch in choices(c):
        pool = [r for r in c.runs if r.kind in ("grid", "epochs") and (r.setting, r.form) == (ch.setting, ch.form)
                and r.val and r.recon_cpu_s is not None and r.recon_min <= minutes]
        if pool and ch.chosen.recon_min > minutes:
            out.append(min(pool, key=val_ppl))
    return out


def seeded(c: Campaign) -> list[tuple[Choice, Run | None]]:
    """Every point with ``seeds/`` runs: its seed-0 ``grid/`` or ``epochs/`` run with the seeds, and the form's
    chosen run (the point itself, or a later choice when a grid grew after its seeds ran)."""
    chosen = {(ch.setting, ch.form): ch.chosen for ch in choices(c)}
    points = sorted({(r.setting, r.form, r.lr, r.epochs) for r in c.runs if r.kind == "seeds"},
                    key=lambda k: (order(k[0], k[1]), k[3], k[2]))
    out = []
    for s, f, lr, e in points:
        at = [r for r in c.runs if (r.setting, r.form, r.epochs) == (s, f, e) and math.isclose(r.lr, lr)]
        zero = [r for r in at if r.kind in ("grid", "epochs") and r.seed == 0]
        if zero:
            more = sorted((r for r in at if r.kind == "seeds"), key=lambda r: r.seed)
            out.append((Choice(s, f, zero[0], (zero[0], *more)), chosen.get((s, f))))
    return out


def _cells(grid: Grid) -> str:
    fmt = (lambda r: rate(r.lr)) if grid.axis == "lr" else (lambda r: str(r.epochs))
    return ", ".join(f"{fmt(r)}: " + (f"**{val_ppl(r):.2f}**" if r is grid.chosen else f"{val_ppl(r):.2f}")
                     for r in grid.runs)


def grid_tables(c: Campaign) -> list[str]:
    """The rate grids and, at each 3-epoch grid's chosen rate, the epochs grid."""
    rows = []
    for g in rate_grids(c):
        at = epochs_grid(c, g) if g.runs[0].epochs == 3 else None
        rows.append([setting_label(g.setting), method_label(g.form), str(g.runs[0].epochs), _cells(g),
                     rate(g.chosen.lr), g.status, _cells(at) if at and len(at.runs) > 1 else "not run",
                     str(at.chosen.epochs) if at and len(at.runs) > 1 else "–",
                     at.status if at and len(at.runs) > 1 else "–"])
    if not rows:
        return ["No rate grid has finished yet.", ""]
    head = ["Setting", "Form", "epochs", "lr: merged val PPL (seed 0)", "chosen lr", "interior",
            "epochs at the chosen lr: val PPL", "chosen epochs", "interior"]
    return [*markdown_table(head, rows, 3), ""]
