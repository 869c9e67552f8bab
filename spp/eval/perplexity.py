"""Token-level perplexity over non-overlapping windows (the WikiText-2 protocol of SparseGPT / Wanda / SPP).

``PPL = exp(mean next-token NLL)`` over ``seqlen`` windows of the ``"\\n\\n"``-joined test rows, equal to Wanda's.
Not lm-eval's ``wikitext`` (rolling word perplexity): never compare the two."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from spp.eval.progress_lines import progress
from spp.models.block_runner import in_eval_mode
from spp.paths import find_data, read_json_records

WIKITEXT2_TEST = "wikitext2/test.json"
WIKITEXT2_VALIDATION = "wikitext2/validation.json"
WIKITEXT2_VAL = "wikitext2_val"
"""The WikiText-2 *validation* split as a perplexity source (the recovery study: the selection objective of a sweep)."""
C4_SAMPLE = "c4/c4_sample.jsonl"
C4_MAX_DOCS = 1100
C4_MAX_WINDOWS = 256
HUB_WIKITEXT2 = "hf:wikitext2"
SOURCES = ("wikitext2", WIKITEXT2_VAL, "c4", HUB_WIKITEXT2)
LOCAL_SOURCES = {"wikitext2": WIKITEXT2_TEST, WIKITEXT2_VAL: WIKITEXT2_VALIDATION, "c4": C4_SAMPLE}
"""The file (under a data root) each named local source reads."""
WINDOW_SAMPLING = ("first", "systematic")
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95


@dataclass
class PerplexityResult:
    """Result of :func:`perplexity`; NLLs in nats, ``tokens = windows * (seqlen - 1)``.

    ``window_nll`` / ``window_starts`` are per evaluated window (token offsets in the split); ``split_windows`` the
    population sampled from; ``ci_low`` / ``ci_high`` the 95 % percentile-bootstrap interval of ``ppl`` over windows
    (seed :data:`BOOTSTRAP_SEED`)."""

    ppl: float
    nll_mean: float
    seqlen: int
    windows: int
    tokens: int
    source: str
    window_nll: list[float] = field(default_factory=list)
    window_starts: list[int] = field(default_factory=list)
    sampling: str = "first"
    stride: int = 1
    split_windows: int = 0
    ci_low: float | None = None
    ci_high: float | None = None
    ci_resamples: int = BOOTSTRAP_RESAMPLES

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-serialisable)."""
        return asdict(self)


def _read_rows(path: Path) -> list[str]:
    """Read the ``text`` field of every line of a JSON-lines file, or the elements of a JSON array."""
    records = read_json_records(path, "point eval.ppl_source at a valid JSON array / JSON-lines file")
    try:
        return [str(r["text"]) for r in records]
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: every record needs a 'text' field (JSON lines of {{\"text\": ...}})") from err


def source_file(source: str, data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The local file a perplexity source reads (``None`` for the hub source ``hf:wikitext2``)."""
    if source == HUB_WIKITEXT2:
        return None
    if source in LOCAL_SOURCES:
        return find_data(LOCAL_SOURCES[source], data_dir)
    path = Path(source).expanduser()
    if path.suffix not in {".json", ".jsonl", ".txt"}:
        raise ValueError(f"unknown perplexity source {source!r} (eval.ppl_source): use one of {', '.join(SOURCES)} "
                         "or a .json/.jsonl/.txt path")
    if not path.is_file():
        raise FileNotFoundError(f"eval.ppl_source={source!r} does not exist")
    return path


def load_eval_text(source: str = "wikitext2", data_dir: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """``(text, label)`` for a perplexity source: ``wikitext2`` / ``wikitext2_val`` (raw rows joined by ``"\\n\\n"``),
    ``c4`` (first 1,100 documents of the local sample of C4 *train* shard 0 joined by ``" "``, as SparseGPT's
    ``get_c4``), ``hf:wikitext2`` (hub), or a ``.json``/``.jsonl`` of ``{"text": ...}`` rows or ``.txt`` path."""
    if source == HUB_WIKITEXT2:
        from datasets import load_dataset  # heavy optional path (network); only for the hub source

        rows = load_dataset("wikitext", "wikitext-2-raw-v1", split="test")["text"]
        return "\n\n".join(rows), "wikitext2"
    path = source_file(source, data_dir)
    if source == "c4":
        return " ".join(_read_rows(path)[:C4_MAX_DOCS]), "c4-train00000-sample"
    if path.suffix == ".txt":
        return path.read_text(encoding="utf-8"), str(path)
    return "\n\n".join(_read_rows(path)), source if source in LOCAL_SOURCES else str(path)


def check_seqlen(seqlen: int, max_positions: int | None) -> None:
    """Raise a clear error when ``seqlen`` exceeds the model's context (``max_position_embeddings``)."""
    if seqlen < 2:
        raise ValueError(f"eval.seqlen={seqlen} must be at least 2 (one token of context, one to predict)")
    if max_positions is not None and seqlen > max_positions:
        raise ValueError(
            f"eval.seqlen={seqlen} exceeds the model's max_position_embeddings={max_positions}; "
            f"set eval.seqlen<={max_positions}"
        )


def window_indices(n: int, max_windows: int | None, sampling: str = "first") -> list[int]:
    """Indices of the windows to evaluate among the ``n`` whole windows of a split.

    ``first``: ``0 .. m-1``; ``systematic``: ``o, o+k, ..., o+(m-1)k`` with ``k = n // m`` and ``o`` centring the
    sample, so the windows span the split; with ``m >= n`` or ``None`` both give all ``n``."""
    if sampling not in WINDOW_SAMPLING:
        raise ValueError(f"eval.window_sampling={sampling!r} must be one of {', '.join(WINDOW_SAMPLING)}")
    m = n if max_windows is None else min(n, int(max_windows))
    if sampling == "first" or m == n:
        return list(range(m))
    k = n // m
    offset = (n - 1 - (m - 1) * k) // 2  # the windows the stride leaves over are split between both ends
    return [offset + i * k for i in range(m)]


def tokenize_windows(text: str, tokenizer: Any, seqlen: int, max_windows: int | None = None,
                     sampling: str = "first") -> tuple[torch.Tensor, list[int], int]:
    """Tokenize ``text`` once and cut it into ``seqlen`` windows: ``(picked windows (m, seqlen), their token offsets,
    n whole windows)``."""
    ids = tokenizer(text, return_tensors="pt", verbose=False).input_ids[0]
    n = ids.numel() // seqlen
    if n < 1:
        raise ValueError(f"the text has {ids.numel()} tokens, fewer than one window of seqlen={seqlen}")
    idx = window_indices(n, max_windows, sampling)
    all_windows = ids[: n * seqlen].view(n, seqlen)
    return all_windows[idx], [i * seqlen for i in idx], n


def bootstrap_ppl_interval(window_nll: list[float] | np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES,
                           seed: int = BOOTSTRAP_SEED, level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``exp(mean NLL)`` over windows (equal-length windows, so the mean of
    window means is the token mean). Resamples windows with replacement, ``numpy.random.default_rng(seed)``."""
    x = np.asarray(window_nll, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap needs at least one window")
    lo, hi = _interval(_resampled_means(x, resamples, seed), level)
    return math.exp(lo), math.exp(hi)


def _resampled_means(x: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Means over the last axis (windows) of ``resamples`` bootstrap resamples of the windows (the same resampled
    windows for every row of a 2-D ``x``) -> ``(..., resamples)``."""
    idx = np.random.default_rng(seed).integers(0, x.shape[-1], size=(resamples, x.shape[-1]))
    return x[..., idx].mean(axis=-1)


def _interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap ``samples``."""
    alpha = (1.0 - level) / 2.0
    lo, hi = (float(v) for v in np.quantile(samples, [alpha, 1.0 - alpha]))
    return lo, hi


def _windows_nll(r: dict[str, Any]) -> tuple[np.ndarray, tuple[Any, ...]]:
    if not r.get("window_nll"):
        raise ValueError("perplexity result has no per-window NLL (an older record; measure it again)")
    return np.asarray(r["window_nll"], dtype=np.float64), (r.get("source"), r.get("seqlen"),
                                                           tuple(r.get("window_starts") or ()))


def window_nll_matrix(*results: dict[str, Any]) -> np.ndarray:
    """The per-window NLLs of results measured on the same windows, shape ``(len(results), windows)``."""
    arrays, keys = zip(*(_windows_nll(r) for r in results), strict=True)
    if any(k != keys[0] for k in keys[1:]):
        raise ValueError("paired comparison needs results on the same windows (source, seqlen, window_starts)")
    return np.stack(arrays)


def paired_difference(a: dict[str, Any], b: dict[str, Any],
                      resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                      level: float = CI_LEVEL) -> dict[str, float]:
    """Paired comparison of ``a`` against ``b`` on the same windows, with percentile-bootstrap intervals (windows
    resampled jointly): ``log_ppl_diff`` (mean of ``nll_a - nll_b``) and ``ppl_ratio = exp(log_ppl_diff)``."""
    x = window_nll_matrix(a, b)
    d = x[0] - x[1]
    lo, hi = _interval(_resampled_means(d, resamples, seed), level)
    mean = float(d.mean())
    return {"log_ppl_diff": mean, "log_ppl_diff_low": lo, "log_ppl_diff_high": hi,
            "ppl_ratio": math.exp(mean), "ppl_ratio_low": math.exp(lo), "ppl_ratio_high": math.exp(hi),
            "windows": int(d.size), "resamples": resamples}


def gap_closed(dense: dict[str, Any], pruned: dict[str, Any],
               merged: dict[str, Any], resamples: int = BOOTSTRAP_RESAMPLES,
               seed: int = BOOTSTRAP_SEED, level: float = CI_LEVEL) -> dict[str, float]:
    """Fraction of the log-perplexity gap closed, ``(log ppl_pruned - log ppl_merged) / (log ppl_pruned -
    log ppl_dense)``, with a paired percentile-bootstrap interval (the same resampled windows for all three)."""
    x = window_nll_matrix(dense, pruned, merged)
    if not x[1].mean() > x[0].mean():
        raise ValueError("gap closed needs a pruned model worse than the dense one (no log-perplexity gap)")
    m = _resampled_means(x, resamples, seed)  # (3, resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = (m[1] - m[2]) / (m[1] - m[0])
    boot = boot[np.isfinite(boot)]
    mu = x.mean(axis=1)
    lo, hi = _interval(boot, level)
    return {"gap_closed": float((mu[1] - mu[2]) / (mu[1] - mu[0])), "gap_closed_low": lo, "gap_closed_high": hi,
            "windows": int(x.shape[1]), "resamples": resamples}


def nll_sums(logits: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
    """Sum of next-token NLL (fp32) of each window of a batch ``(b, seqlen)`` from its logits -> ``(b,)``."""
    logits = logits.float()
    shift_logits = logits[:, :-1].reshape(-1, logits.size(-1))
    shift_labels = windows[:, 1:].reshape(-1).to(logits.device)
    nll = F.cross_entropy(shift_logits, shift_labels, reduction="none")
    return nll.view(windows.size(0), -1).sum(dim=1)


@dataclass
class Windows:
    """The token windows one perplexity measurement scores (see :func:`eval_windows`)."""

    ids: torch.Tensor
    starts: list[int]
    split_windows: int
    label: str
    seqlen: int
    sampling: str

    def batches(self, batch_size: int) -> list[torch.Tensor]:
        """The windows in batches of ``batch_size`` (the last may be smaller)."""
        return list(self.ids.split(batch_size))


def eval_windows(tokenizer: Any, source: str = "wikitext2", seqlen: int = 2048, max_windows: int | None = None,
                 batch_size: int = 1, data_dir: str | os.PathLike[str] | None = None, sampling: str = "first",
                 model: object = None) -> Windows:
    """Check the settings (``seqlen`` within ``model``'s ``max_position_embeddings``, if any), read and tokenize
    ``source`` and pick the windows to score."""
    check_seqlen(seqlen, getattr(getattr(model, "config", None), "max_position_embeddings", None))
    if batch_size < 1:
        raise ValueError(f"eval.batch_size={batch_size} must be >= 1")
    if max_windows is not None and max_windows < 1:
        raise ValueError(f"eval.max_windows={max_windows} must be >= 1 or null (all windows)")
    text, label = load_eval_text(source, data_dir)
    if source == "c4" and max_windows is None:
        max_windows = C4_MAX_WINDOWS  # SparseGPT's C4 protocol: the first 256 windows
    ids, starts, split_windows = tokenize_windows(text, tokenizer, seqlen, max_windows, sampling)
    return Windows(ids, starts, split_windows, label, seqlen, sampling)


def result_from_sums(per_window: torch.Tensor, windows: Windows) -> PerplexityResult:
    """The perplexity, per-window NLL and bootstrap interval from each window's summed NLL (float64)."""
    seqlen, starts = windows.seqlen, windows.starts
    n_windows = windows.ids.size(0)
    tokens = n_windows * (seqlen - 1)
    nll_mean = float(per_window.sum()) / tokens
    window_nll = (per_window / (seqlen - 1)).tolist()
    lo, hi = bootstrap_ppl_interval(window_nll) if all(math.isfinite(v) for v in window_nll) else (None, None)
    stride = starts[1] // seqlen - starts[0] // seqlen if len(starts) > 1 else 1
    return PerplexityResult(
        ppl=math.exp(nll_mean), nll_mean=nll_mean, seqlen=seqlen, windows=n_windows, tokens=tokens,
        source=windows.label, window_nll=window_nll, window_starts=starts, sampling=windows.sampling, stride=stride,
        split_windows=windows.split_windows, ci_low=lo, ci_high=hi,
    )


@torch.no_grad()
def score_windows(model: torch.nn.Module, windows: Windows, batch_size: int, batches: Iterable[int],
                  device: torch.device | str, quiet: bool = False) -> torch.Tensor:
    """Summed next-token NLL (float64, CPU) of every window; windows outside ``batches`` are left 0."""
    sums = torch.zeros(windows.ids.size(0), dtype=torch.float64)
    chunks = windows.batches(batch_size)
    with in_eval_mode(model):
        for b in progress(batches, f"ppl {windows.label}@{windows.seqlen}: batch", "batch",
                          disable=quiet):  # outside a terminal: a log line every 30 s and one at the end
            start = b * batch_size
            logits = model(input_ids=chunks[b].to(device), use_cache=False).logits
            sums[start : start + chunks[b].size(0)] = nll_sums(logits, chunks[b]).double().cpu()
    return sums


def perplexity(
    model: torch.nn.Module,
    tokenizer: Any,
    source: str = "wikitext2",
    seqlen: int = 2048,
    max_windows: int | None = None,
    batch_size: int = 1,
    data_dir: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    sampling: str = "first",
) -> PerplexityResult:
    """Perplexity of ``model`` on non-overlapping ``seqlen``-token windows of ``source``.

    ``PPL = exp( (1 / (W (L-1))) * sum_w sum_{t=1}^{L-1} -log p(x_{w,t} | x_{w,<t}) )`` with ``W`` windows
    of ``L = seqlen`` tokens. ``max_windows=None`` takes all windows (for ``c4`` the first 256, as SparseGPT);
    ``device`` defaults to the model's first parameter's."""
    windows = eval_windows(tokenizer, source, seqlen, max_windows, batch_size, data_dir, sampling, model)
    if device is None:
        device = next(model.parameters()).device
    return result_from_sums(score_windows(model, windows, batch_size, range(len(windows.batches(batch_size))),
                                          device), windows)
