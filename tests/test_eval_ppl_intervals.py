"""Per-window NLL, systematic window sample, bootstrap intervals, paired differences and gap closed,
each checked against an independent computation (a float64 loop over the model, numpy/scipy resampling)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from spp.eval.config import EvalConfig
from spp.eval.perplexity import (
    bootstrap_ppl_interval,
    gap_closed,
    paired_difference,
    perplexity,
    window_indices,
)
from spp.eval.tables import final_metrics, ppl_text


def test_window_indices_first_and_systematic():
    assert window_indices(10, 4, "first") == [0, 1, 2, 3]
    assert window_indices(10, 4, "systematic") == [1, 3, 5, 7]  # k = 10 // 4 = 2, offset (9 - 6) // 2 = 1
    assert window_indices(560, 40, "systematic") == list(range(6, 553, 14))  # k = 14, offset (559 - 546) // 2 = 6
    assert window_indices(7, None, "systematic") == list(range(7))
    assert window_indices(5, 9, "systematic") == list(range(5))
    idx = window_indices(563, 48, "systematic")
    assert len(idx) == 48 and len(set(idx)) == 48 and idx[0] <= 23 and idx[-1] >= 563 - 24  # spans the split
    with pytest.raises(ValueError, match="eval.window_sampling"):
        window_indices(10, 2, "random")
    with pytest.raises(ValueError, match="eval.window_sampling"):
        EvalConfig(window_sampling="every")


def _window_nll(model, ids: torch.Tensor, start: int, seqlen: int) -> float:
    x = ids[start : start + seqlen].unsqueeze(0)
    with torch.no_grad():
        logp = torch.log_softmax(model(x).logits.double(), dim=-1)[0]
    return -sum(float(logp[t, x[0, t + 1]]) for t in range(seqlen - 1)) / (seqlen - 1)


def test_systematic_windows_and_per_window_nll(tiny_model, tiny_tok, sample_data_dir):
    rows = [json.loads(line)["text"] for line in (sample_data_dir / "wikitext2/test.json").open()]
    ids = tiny_tok("\n\n".join(rows), return_tensors="pt").input_ids[0]
    seqlen = 64
    n = ids.numel() // seqlen
    res = perplexity(tiny_model, tiny_tok, seqlen=seqlen, max_windows=3, data_dir=sample_data_dir,
                     sampling="systematic", batch_size=2)
    k = n // 3
    o = (n - 1 - 2 * k) // 2
    assert res.split_windows == n and res.stride == k and res.sampling == "systematic"
    assert res.window_starts == [o * seqlen, (o + k) * seqlen, (o + 2 * k) * seqlen]
    expected = [_window_nll(tiny_model, ids, s, seqlen) for s in res.window_starts]
    assert res.window_nll == pytest.approx(expected, rel=1e-6)
    assert res.nll_mean == pytest.approx(float(np.mean(expected)), rel=1e-6)
    assert res.ppl == pytest.approx(math.exp(np.mean(expected)), rel=1e-6)
    assert res.ci_low <= res.ppl <= res.ci_high
    first = perplexity(tiny_model, tiny_tok, seqlen=seqlen, max_windows=3, data_dir=sample_data_dir)
    assert first.window_starts == [0, seqlen, 2 * seqlen] and first.stride == 1 and first.sampling == "first"
    assert first.window_nll[0] == pytest.approx(_window_nll(tiny_model, ids, 0, seqlen), rel=1e-6)
    d = res.to_dict()
    assert {"window_nll", "window_starts", "ci_low", "ci_high", "sampling", "stride", "split_windows"} <= set(d)


def test_bootstrap_interval_matches_scipy_percentile_bootstrap():
    x = np.random.default_rng(7).normal(3.0, 0.4, size=48)
    lo, hi = bootstrap_ppl_interval(x, resamples=20000, seed=1)
    ref = stats.bootstrap((x,), np.mean, n_resamples=20000, method="percentile", confidence_level=0.95,
                          random_state=np.random.default_rng(2)).confidence_interval
    # different random draws: agree to Monte-Carlo error (~1 % of the interval width at 20,000 resamples)
    width = ref.high - ref.low
    assert math.log(lo) == pytest.approx(ref.low, abs=0.03 * width)
    assert math.log(hi) == pytest.approx(ref.high, abs=0.03 * width)
    # and with the normal approximation of the mean: mean ± 1.96 s/sqrt(n)
    se = x.std(ddof=0) / math.sqrt(x.size)
    assert math.log(lo) == pytest.approx(x.mean() - 1.96 * se, abs=0.1 * width)
    # fixed seed: reproducible; a constant sample has a zero-width interval
    assert bootstrap_ppl_interval(x, resamples=500, seed=3) == bootstrap_ppl_interval(x, resamples=500, seed=3)
    assert bootstrap_ppl_interval([2.0] * 10) == pytest.approx((math.exp(2.0), math.exp(2.0)))


def _result(nll, starts=None):
    nll = list(map(float, nll))
    return {"ppl": math.exp(np.mean(nll)), "window_nll": nll, "seqlen": 512, "source": "wikitext2",
            "window_starts": starts if starts is not None else [512 * i for i in range(len(nll))]}


def test_paired_difference_against_numpy_loop():
    rng = np.random.default_rng(0)
    base = rng.normal(5.0, 0.5, size=40)  # large between-window spread ...
    a, b = base + 0.30 + rng.normal(0, 0.02, 40), base  # ... small, consistent paired difference
    out = paired_difference(_result(a), _result(b), resamples=4000, seed=5)
    assert out["log_ppl_diff"] == pytest.approx(float(np.mean(a - b)), rel=1e-12)
    assert out["ppl_ratio"] == pytest.approx(math.exp(np.mean(a)) / math.exp(np.mean(b)), rel=1e-12)
    # independent bootstrap: explicit loop over resamples with another generator
    g = np.random.default_rng(11)
    boot = []
    for _ in range(4000):
        i = g.integers(0, 40, 40)
        boot.append(np.mean(a[i]) - np.mean(b[i]))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    width = hi - lo
    assert out["log_ppl_diff_low"] == pytest.approx(lo, abs=0.05 * width)
    assert out["log_ppl_diff_high"] == pytest.approx(hi, abs=0.05 * width)
    assert out["ppl_ratio_low"] == pytest.approx(math.exp(out["log_ppl_diff_low"]))
    # pairing matters: the unpaired interval of each ppl is far wider than the paired one
    ua = bootstrap_ppl_interval(a)
    assert math.log(ua[1]) - math.log(ua[0]) > 5 * width
    with pytest.raises(ValueError, match="same windows"):
        paired_difference(_result(a), _result(b, starts=list(range(40))))
    with pytest.raises(ValueError, match="per-window NLL"):
        paired_difference({"ppl": 3.0}, _result(b))


def test_gap_closed_against_numpy_loop():
    rng = np.random.default_rng(1)
    dense = rng.normal(3.4, 0.4, size=48)
    pruned = dense + 2.0 + rng.normal(0, 0.15, 48)
    merged = dense + 1.2 + rng.normal(0, 0.15, 48)
    out = gap_closed(_result(dense), _result(pruned), _result(merged), resamples=4000, seed=2)
    point = (np.log(math.exp(pruned.mean())) - np.log(math.exp(merged.mean()))) / (pruned.mean() - dense.mean())
    assert out["gap_closed"] == pytest.approx(point, rel=1e-12)
    g = np.random.default_rng(99)
    boot = []
    for _ in range(4000):
        i = g.integers(0, 48, 48)
        boot.append((pruned[i].mean() - merged[i].mean()) / (pruned[i].mean() - dense[i].mean()))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    width = hi - lo
    assert out["gap_closed_low"] == pytest.approx(lo, abs=0.05 * width)
    assert out["gap_closed_high"] == pytest.approx(hi, abs=0.05 * width)
    assert out["gap_closed_low"] < out["gap_closed"] < out["gap_closed_high"]
    assert 0.3 < out["gap_closed"] < 0.5


def test_tables_show_the_interval_and_loggers_get_the_gap():
    assert ppl_text({"ppl": 136.654, "ci_low": 120.1, "ci_high": 150.333}) == "136.65 [120.10, 150.33]"
    assert ppl_text({"ppl": 30.0}) == "30.00"
    out = final_metrics({"perplexity": {"merged": {"ppl": 2.0, "ci_low": 1.5, "ci_high": 2.5}},
                         "gap_closed": {"gap_closed": 0.4, "gap_closed_low": 0.3, "gap_closed_high": 0.5,
                                        "windows": 40}})
    assert out["final/ppl_merged_ci_low"] == 1.5 and out["final/gap_closed_high"] == 0.5
    assert "final/windows" not in out
