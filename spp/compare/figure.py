"""A metric of a sweep against one swept key, one line per setting of the other swept keys, with the intervals."""

from __future__ import annotations

from typing import Any

from spp.compare.runs import MISSING
from spp.compare.table import COMPARED_METRICS
from spp.errors import UserError


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def choose_x(rows: list[dict[str, Any]], keys: list[str], x: str | None) -> str:
    """``x`` when it is a swept key, else the first numeric swept key, else the first; ``UserError`` if none fits."""
    if x is not None and x not in keys:
        raise UserError(f"--x {x} is not a swept key of these runs", f"use one of: {', '.join(keys) or '(none)'}",
                        key="--x")
    if x is not None:
        return x
    if not keys:
        raise UserError("these runs differ in no config key, so there is nothing to draw against",
                        "compare a folder holding runs that differ (a multirun folder)", key="--x")
    numeric = [k for k in keys if all(_as_float(str(r[k])) is not None for r in rows)]
    return (numeric or keys)[0]


def _series(rows: list[dict[str, Any]], keys: list[str], x: str) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by the values of the swept keys other than ``x`` (legend label → rows); a label names each
    key by its last part (``use_beta=False``) unless two keys share it."""
    others = [k for k in keys if k != x]
    short = {k: k.rpartition(".")[2] for k in others}
    if len(set(short.values())) < len(short):
        short = {k: k for k in others}
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        label = ", ".join(f"{short[k]}={row[k]}" for k in others) or "runs"
        out.setdefault(label, []).append(row)
    return out


def plot_metric(rows: list[dict[str, Any]], keys: list[str], metric: str = "ppl", x: str | None = None,
                ax: Any = None) -> Any:
    """Draw ``metric`` against the swept key ``x``: one line per setting of the other keys, 95 % intervals as bars.

    On ``ax`` when given (a notebook), else on a new display-free ``matplotlib.figure.Figure``; returns the figure."""
    if metric not in COMPARED_METRICS:
        raise UserError(f"--metric {metric} is not a compared metric", f"use one of: {', '.join(COMPARED_METRICS)}",
                        key="--metric")
    x = choose_x(rows, keys, x)
    if ax is None:
        from matplotlib.figure import Figure  # matplotlib (the dev extra) only when a figure is drawn

        ax = Figure(figsize=(8, 5), layout="constrained").add_subplot()
    values = [str(r[x]) for r in rows]
    numeric = all(_as_float(v) is not None for v in values if v != MISSING)
    categories = list(dict.fromkeys(values))
    position = (lambda v: _as_float(v)) if numeric else categories.index
    info = COMPARED_METRICS[metric]
    series = _series(rows, keys, x)
    spread = [position(v) for v in categories if v != MISSING]
    step = 0.08 if not numeric else 0.015 * ((max(spread) - min(spread)) or 1.0)
    intervals = False
    for i, (label, group) in enumerate(series.items()):
        dodge = (i - (len(series) - 1) / 2) * step  # side by side, so overlapping intervals stay readable
        group = sorted((r for r in group if r[metric] is not None and str(r[x]) != MISSING),
                       key=lambda r: position(str(r[x])))
        xs = [position(str(r[x])) + dodge for r in group]
        ys = [float(r[metric]) for r in group]
        err = None
        if info.interval and all(r.get(f"{metric}_low") is not None for r in group):
            err = [[y - r[f"{metric}_low"] for y, r in zip(ys, group, strict=True)],
                   [r[f"{metric}_high"] - y for y, r in zip(ys, group, strict=True)]]
            intervals = intervals or bool(group)
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, label=label)
    if not numeric:
        ax.set_xticks(range(len(categories)), categories)
    ax.set_xlabel(x)
    ax.set_ylabel(info.axis + (" (bars: 95 % interval)" if intervals else ""))
    ax.set_title(f"{metric} against {x}")
    if len(series) > 1 or keys != [x]:  # below the axes: labels of many keys stay readable
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    ax.grid(alpha=0.3)
    return ax.figure
