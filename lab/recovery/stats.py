"""Paired intervals of the recovery study: two methods trained with the same seeds and measured on the same windows.

For seeds ``s = 1..S`` and windows ``w = 1..W``, ``d[s, w] = nll_a[s, w] - nll_b[s, w]`` (per-window NLL of the
merged models; a seed pairs the two methods' initialisation, data order and split). The log-perplexity ratio is
``mean(d)``; its interval is a two-level percentile bootstrap: each resample draws ``S`` seeds and ``W`` windows
with replacement and averages ``d`` over them, so both the seed-to-seed and the window-to-window variation are in
the interval (one seed: the windows-only bootstrap of :func:`spp.eval.perplexity.paired_difference`).

With few seeds that bootstrap treats the seeds it drew as the whole population of seeds and comes out too narrow
(``lab/recovery/coverage.py`` measures how often). The small-sample interval of :func:`seed_t_interval` is the one the
verdicts use for 2 to :data:`MAX_SMALL_SAMPLE_SEEDS` seeds: with per-seed log-ratios ``r_s = mean_w d[s, w]``
(``n`` seeds) and per-window means over seeds ``m_w = mean_s d[s, w]`` (``W`` windows),
``mean(d) ± t(0.975, n − 1) · sqrt(var(r) / n + var(m) / W)``: Student's t with ``n − 1`` degrees of freedom on the
seed-to-seed variance, with the sampling variance of the shared windows added (the seeds are measured on the same
windows, so the seed spread alone leaves the windows' out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spp.eval.perplexity import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CI_LEVEL, window_nll_matrix

T_975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139)
"""Student's t 0.975 quantile for 1..10 degrees of freedom."""
MAX_SMALL_SAMPLE_SEEDS = 9
"""Up to this many seeds the verdicts use the small-sample interval; from 10 seeds on the two-level bootstrap."""


@dataclass(frozen=True)
class PairedRatio:
    """``ppl_a / ppl_b`` over ``seeds`` with its interval; ``per_seed`` are the seeds' own ratios."""

    ratio: float
    low: float
    high: float
    seeds: int
    windows: int
    per_seed: tuple[float, ...]
    t_low: float | None = None
    t_high: float | None = None
    """The small-sample interval (:func:`seed_t_interval`; ``None`` with one seed)."""

    @property
    def small_sample(self) -> bool:
        """The verdict rests on the small-sample interval (2 to :data:`MAX_SMALL_SAMPLE_SEEDS` seeds)."""
        return self.t_low is not None and self.seeds <= MAX_SMALL_SAMPLE_SEEDS

    @property
    def interval(self) -> tuple[float, float]:
        """The interval verdicts use: the small-sample one for 2 to 9 seeds, else the bootstrap (one seed: windows
        only; 10 or more: seeds × windows)."""
        return (self.t_low, self.t_high) if self.small_sample else (self.low, self.high)  # type: ignore[return-value]

    @property
    def verdict(self) -> str:
        """``a lower`` / ``a higher`` when :attr:`interval` excludes 1, else ``not distinguishable``."""
        low, high = self.interval
        if high < 1.0:
            return "a lower"
        return "a higher" if low > 1.0 else "not distinguishable"


def nll_differences(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> np.ndarray:
    """``d[s, w]`` of the seed-paired perplexity entries ``a[s]``, ``b[s]`` (every entry on the same windows)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired seeds: {len(a)} runs against {len(b)}; pair each seed of one method with the same "
                         "seed of the other")
    x = window_nll_matrix(*a, *b)
    return x[: len(a)] - x[len(a):]


def t_quantile(df: int) -> float:
    """Student's t 0.975 quantile for ``df`` degrees of freedom (1 to 10; the normal 1.96 past 10 would be too
    narrow there, so it refuses).

    Raises:
        ValueError: ``df`` outside 1..10.
    """
    if not 1 <= df <= len(T_975):
        raise ValueError(f"t quantile for {df} degrees of freedom: give 1 to {len(T_975)} (2 to 11 seeds)")
    return T_975[df - 1]


def seed_t_interval(d: np.ndarray) -> tuple[float, float]:
    """The small-sample 95 % interval of ``mean(d)`` (log scale) for ``d[s, w]`` with 2 to 11 seeds (module
    docstring).

    Raises:
        ValueError: fewer than 2 or more than 11 seeds.
    """
    n, w = d.shape
    half = t_quantile(n - 1) * math.sqrt(d.mean(axis=1).var(ddof=1) / n + d.mean(axis=0).var(ddof=1) / w)
    centre = float(d.mean())
    return centre - half, centre + half


def two_level_bootstrap(d: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                        level: float = CI_LEVEL) -> tuple[float, float]:
    """The two-level percentile bootstrap interval of ``mean(d)`` (log scale; module docstring)."""
    s, w = d.shape
    rng = np.random.default_rng(seed)
    si = rng.integers(0, s, size=(resamples, s))
    wi = rng.integers(0, w, size=(resamples, w))
    boot = d[si[:, :, None], wi[:, None, :]].mean(axis=(1, 2))
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def paired_ratio(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED, level: float = CI_LEVEL) -> PairedRatio:
    """The two-level bootstrap of the module docstring for the seed-paired entries ``a``, ``b``, with the
    small-sample interval for 2 to 11 seeds."""
    d = nll_differences(a, b)
    s, w = d.shape
    lo, hi = two_level_bootstrap(d, resamples, seed, level)
    t = seed_t_interval(d) if 2 <= s <= len(T_975) + 1 else None
    return PairedRatio(ratio=math.exp(float(d.mean())), low=math.exp(lo), high=math.exp(hi), seeds=s,
                       windows=w, per_seed=tuple(math.exp(float(v)) for v in d.mean(axis=1)),
                       t_low=math.exp(t[0]) if t else None, t_high=math.exp(t[1]) if t else None)


def gap_closed_per_seed(dense: dict[str, Any], pruned: dict[str, Any], merged: Sequence[dict[str, Any]]) -> list[float]:
    """``(log ppl_pruned - log ppl_merged) / (log ppl_pruned - log ppl_dense)`` of each seed's merged model."""
    gap = math.log(pruned["ppl"]) - math.log(dense["ppl"])
    return [(math.log(pruned["ppl"]) - math.log(m["ppl"])) / gap for m in merged]
