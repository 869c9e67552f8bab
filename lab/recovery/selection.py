"""The recovery study's learning-rate grids: the rate of each (setting, method) is the grid point with the lowest merged
WikiText-2 *validation* perplexity (never a test-split number), and a grid whose chosen rate is an endpoint is
extended by one half-decade point on that side until the choice is interior."""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path

from lab.lr_select import GridPoint, best, load_grid

OBJECTIVE = "ppl_val_merged"
"""What every grid is selected on: the merged model's WikiText-2 validation perplexity."""
LADDERS = {"1-2-5": (1, 2, 5), "1-3": (1, 3)}
"""Half-decade ladders: SPP's grid steps 1, 2, 5 per decade ({1e-2, 2e-2, 5e-2, 1e-1}), the others 1, 3."""
LR_BOUNDS = (1e-6, 1.0)
"""A grid is never extended outside these rates."""
BASE_GRIDS: dict[str, tuple[str, ...]] = {
    "spp": ("1e-2", "2e-2", "5e-2", "1e-1"), "lora": ("3e-3", "1e-2", "3e-2"),
    "sparse_lora": ("3e-3", "1e-2", "3e-2"), "scale_lora": ("3e-3", "1e-2", "3e-2"),
    "masked_full": ("3e-4", "1e-3", "3e-3"), "norms": ("1e-3", "3e-3", "1e-2"), "losa": ("1e-3", "3e-3", "1e-2"),
}
"""Each method's half-decade grid at the anchor setting, before any extension (the runner reads it
via ``python -m lab.recovery grid-rates METHOD``); LoSA's, added later, is centred on SparsePEFT's choice (its update
is SparsePEFT's with other ranks)."""
ANCHOR = "nm2_4"
"""The setting whose settled grids centre the other settings' grids (Wanda 2:4: every method runs there)."""


def base_grid(method: str, anchor_lr: float | None = None) -> tuple[str, ...]:
    """``method``'s base grid: :data:`BASE_GRIDS` at the anchor setting, or, for another setting whose anchor grid
    settled on ``anchor_lr`` (interior), the three points centred on it on the method's ladder (SPP 2e-2 ->
    1e-2, 2e-2, 5e-2): the region the method was tuned to, one half-decade step each way, which the endpoint rule
    still extends where the optimum moved (a distilled variant has no grid: it runs at its method's rate)."""
    if method not in BASE_GRIDS:
        raise ValueError(f"no learning-rate grid for method {method!r}; known: {', '.join(BASE_GRIDS)}")
    if anchor_lr is None:
        return BASE_GRIDS[method]
    ladder = ladder_of([float(lr) for lr in BASE_GRIDS[method]])
    m, e = mantissa_exponent(anchor_lr)
    return neighbour(anchor_lr, ladder, up=False), f"{m}e{e}", neighbour(anchor_lr, ladder, up=True)


def settled_anchor(root: str | Path, setting: str, method: str) -> float | None:
    """The chosen rate of ``method``'s anchor grid under campaign ``root`` when ``setting`` is not the anchor and
    that grid is interior (settled), else ``None`` (the full base grid applies)."""
    if setting == ANCHOR:
        return None
    try:
        points = grid_points(Path(root) / "grid" / ANCHOR / method)
    except (FileNotFoundError, ValueError):
        return None
    return best(points).lr if len(points) >= 3 and is_interior(points) else None


def mantissa_exponent(lr: float) -> tuple[int, int]:
    """``3e-3`` -> ``(3, -3)``; raises ValueError for a rate that is not one digit times a power of ten."""
    sign, digits, exp = Decimal(repr(lr)).normalize().as_tuple()
    if sign or len(digits) != 1:
        raise ValueError(f"learning rate {lr!r} is not one digit times a power of ten (grid points: 1e-2, 3e-3, ...)")
    return digits[0], int(exp)


def ladder_of(lrs: list[float]) -> tuple[int, ...]:
    """The ladder a grid's rates lie on: 1-2-5 when a mantissa is 2 or 5, else 1-3."""
    mantissas = {mantissa_exponent(lr)[0] for lr in lrs}
    return LADDERS["1-2-5"] if mantissas & {2, 5} else LADDERS["1-3"]


def neighbour(lr: float, ladder: tuple[int, ...], up: bool) -> str:
    """The next rate above (``up``) or below ``lr`` on ``ladder``, written as a grid directory names it (``3e-2``)."""
    m, e = mantissa_exponent(lr)
    i = ladder.index(m) + (1 if up else -1)
    e += i // len(ladder)
    return f"{ladder[i % len(ladder)]}e{e}"


def grid_points(root: str | Path) -> list[GridPoint]:
    """The grid under ``root`` (one method, one setting), compared on :data:`OBJECTIVE`."""
    return load_grid(root, OBJECTIVE)


def is_interior(points: list[GridPoint]) -> bool:
    """Whether the chosen rate has a grid point on each side."""
    chosen = best(points).lr
    lrs = [p.lr for p in points]
    return min(lrs) < chosen < max(lrs)


def next_point(root: str | Path) -> str:
    """The rate that extends the grid under ``root`` past its chosen endpoint, or ``""`` when the choice is
    interior (or the next rate would leave :data:`LR_BOUNDS`)."""
    points = grid_points(root)
    if is_interior(points):
        return ""
    lrs = [p.lr for p in points]
    chosen = best(points).lr
    nxt = neighbour(chosen, ladder_of(lrs), up=chosen == max(lrs))
    return nxt if LR_BOUNDS[0] <= float(nxt) <= LR_BOUNDS[1] and not math.isclose(float(nxt), chosen) else ""
