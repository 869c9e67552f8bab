"""Paired intervals of the recovery study: two methods trained with the same seeds and measured on the same windows.

For seeds ``s = 1..S`` and windows ``w = 1..W``, ``d[s, w] = nll_a[s, w] - nll_b[s, w]`` (per-window NLL of the
merged models; a seed pairs the two methods' initialisation, data order and split). The log-perplexity ratio is
``mean(d)``; its interval is a two-level percentile bootstrap: each resample draws ``S`` seeds and ``W`` windows
with replacement and averages ``d`` over them, so both the seed-to-seed and the window-to-window variation are in
the interval (one seed: the windows-only bootstrap of :func:`spp.eval.perplexity.paired_difference`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spp.eval.perplexity import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CI_LEVEL, window_nll_matrix


@dataclass(frozen=True)
class PairedRatio:
    """``ppl_a / ppl_b`` over ``seeds`` with its interval; ``per_seed`` are the seeds' own ratios."""

    ratio: float
    low: float
    high: float
    seeds: int
    windows: int
    per_seed: tuple[float, ...]

    @property
    def verdict(self) -> str:
        """``a lower`` / ``a higher`` when the interval excludes 1, else ``not distinguishable``."""
        if self.high < 1.0:
            return "a lower"
        return "a higher" if self.low > 1.0 else "not distinguishable"


def nll_differences(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> np.ndarray:
    """``d[s, w]`` of the seed-paired perplexity entries ``a[s]``, ``b[s]`` (every entry on the same windows)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired seeds: {len(a)} runs against {len(b)}; pair each seed of one method with the same "
                         "seed of the other")
    x = window_nll_matrix(*a, *b)
    return x[: len(a)] - x[len(a):]


def paired_ratio(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED, level: float = CI_LEVEL) -> PairedRatio:
    """The two-level bootstrap of the module docstring for the seed-paired entries ``a``, ``b``."""
    d = nll_differences(a, b)
    s, w = d.shape
    rng = np.random.default_rng(seed)
    si = rng.integers(0, s, size=(resamples, s))
    wi = rng.integers(0, w, size=(resamples, w))
    boot = d[si[:, :, None], wi[:, None, :]].mean(axis=(1, 2))
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
    return PairedRatio(ratio=math.exp(float(d.mean())), low=math.exp(float(lo)), high=math.exp(float(hi)), seeds=s,
                       windows=w, per_seed=tuple(math.exp(float(v)) for v in d.mean(axis=1)))


def gap_closed_per_seed(dense: dict[str, Any], pruned: dict[str, Any], merged: Sequence[dict[str, Any]]) -> list[float]:
    """``(log ppl_pruned - log ppl_merged) / (log ppl_pruned - log ppl_dense)`` of each seed's merged model."""
    gap = math.log(pruned["ppl"]) - math.log(dense["ppl"])
    return [(math.log(pruned["ppl"]) - math.log(m["ppl"])) / gap for m in merged]
