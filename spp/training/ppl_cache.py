"""Perplexity with a small on-disk cache, so a sweep measures the dense and pruned models once."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from spp.atomic import write_json_atomic


def cache_key(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable parts (model identity, pruning and eval settings)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cached_perplexity(
    model: torch.nn.Module,
    tokenizer: Any,
    eval_cfg: Any,
    data_dir: str | os.PathLike[str] | None,
    cache_dir: str | os.PathLike[str] | None,
    key_parts: list[Any],
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """WikiText-2 (or ``eval.ppl_source``) perplexity with the ``eval`` settings, read from the cache if there.

    Args:
        model: The model to measure (dense or pruned).
        tokenizer: Its tokenizer.
        eval_cfg: The ``eval`` group (``seqlen``, ``max_windows``, ``batch_size``, source).
        data_dir: Data root override.
        cache_dir: Cache root; ``None`` disables caching.
        key_parts: What identifies the weights (model identity; pruning settings for a pruned model).
        device: Where to run.

    Returns:
        ``PerplexityResult.to_dict()`` plus ``seconds`` and ``cache_hit``.
    """
    from spp.eval.perplexity import perplexity

    settings = ppl_settings(eval_cfg)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / "ppl" / f"{cache_key(key_parts, settings)}.json"
        if path.is_file():
            result = json.loads(path.read_text())
            result["cache_hit"] = True
            return result
    start = time.perf_counter()
    res = perplexity(model, tokenizer, data_dir=data_dir, device=device, **settings)
    result = {**res.to_dict(), "seconds": round(time.perf_counter() - start, 2), "cache_hit": False}
    if path is not None:
        write_json_atomic(path, result)
    return result


def ppl_settings(eval_cfg: Any) -> dict[str, Any]:
    """The :func:`spp.eval.perplexity.perplexity` keyword arguments held by the ``eval`` group."""
    return {
        "source": eval_cfg.ppl_source,
        "seqlen": int(eval_cfg.seqlen),
        "max_windows": eval_cfg.max_windows,
        "batch_size": int(eval_cfg.batch_size),
    }
