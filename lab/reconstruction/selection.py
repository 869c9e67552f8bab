"""Choosing a reconstruction setting on validation data: each grid point's merged WikiText-2 *validation*
perplexity, the chosen point, and the point that extends a grid past a chosen endpoint (half-decade steps)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

VAL_SOURCE = "wikitext2_val"


def val_ppl(summary: dict[str, Any]) -> float | None:
    """The merged (reconstructed, or reconstructed and trained) model's validation perplexity of a run."""
    entry = (summary.get("merged_ppl_by_source") or {}).get(VAL_SOURCE)
    return float(entry["ppl"]) if entry else None


def grid_points(grid: Path, prefix: str = "lr") -> dict[float, float]:
    """``value -> validation perplexity`` of every finished point ``<grid>/<prefix><value>/summary.json``."""
    out: dict[float, float] = {}
    for summary in sorted(Path(grid).glob(f"{prefix}*/summary.json")):
        ppl = val_ppl(json.loads(summary.read_text()))
        if ppl is not None:
            out[float(summary.parent.name[len(prefix):])] = ppl
    return out


def chosen(grid: Path, prefix: str = "lr") -> float | None:
    """The grid value with the lowest validation perplexity (``None`` for an empty grid)."""
    points = grid_points(grid, prefix)
    return min(points, key=points.get) if points else None


def half_decade(value: float, up: bool) -> float:
    """The next point of a 1-3-10 grid above (``up``) or below ``value``."""
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = value / 10 ** exponent
    if up:
        return float(f"{(3 if mantissa < 2 else 10) * 10 ** exponent:.0e}")
    return float(f"{(0.3 if mantissa < 2 else 1) * 10 ** exponent:.0e}")


def extend(grid: Path, prefix: str = "lr") -> float | None:
    """The value to run next when the chosen point is an endpoint of the grid (``None`` when it is interior)."""
    points = grid_points(grid, prefix)
    if len(points) < 2:
        return None
    best, values = min(points, key=points.get), sorted(points)
    if best == values[0]:
        return half_decade(best, up=False)
    if best == values[-1]:
        return half_decade(best, up=True)
    return None
