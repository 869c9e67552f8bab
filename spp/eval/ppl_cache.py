"""Perplexity with a small on-disk cache, so a sweep measures the dense and the pruned model once.

The key holds the sha256 of the resolved data file, not the source's name; non-finite results are not cached."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from spp.atomic import write_json_atomic
from spp.eval.config import EvalConfig
from spp.eval.perplexity import HUB_WIKITEXT2, perplexity, source_file
from spp.models.config import ModelConfig
from spp.models.loading import model_identity
from spp.paths import file_sha256
from spp.pruning.cache import cache_key as pruning_cache_key
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig

PPL_CACHE_VERSION = "3"
"""Bump when a change to the perplexity code changes its results (version 1 keyed on the source name; version 2
entries hold no per-window NLL, interval or window sampling)."""

log = logging.getLogger(__name__)


def ppl_settings(eval_cfg: EvalConfig) -> dict[str, Any]:
    """The :func:`spp.eval.perplexity.perplexity` keyword arguments held by the ``eval`` group."""
    return {
        "source": eval_cfg.ppl_source,
        "seqlen": int(eval_cfg.seqlen),
        "max_windows": eval_cfg.max_windows,
        "batch_size": int(eval_cfg.batch_size),
        "sampling": eval_cfg.window_sampling,
    }


def weights_key(
    model_cfg: ModelConfig,
    pruner: PrunerConfig | None = None,
    sparsity: SparsityConfig | None = None,
    calibration: CalibrationConfig | None = None,
    data_dir: str | None = None,
) -> str:
    """What identifies the measured weights: the model identity when dense, else the pruning cache's key digest
    (model identity, pruner settings, pattern, calibration settings and calibration file sha256, code version)."""
    if pruner is None or sparsity is None or pruner.name == "none" or sparsity.is_dense:
        return model_identity(model_cfg)
    return pruning_cache_key(model_cfg, pruner, sparsity, calibration or CalibrationConfig(), data_dir)[1]


def data_key(source: str, data_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """How the text is read (``reader``: ``c4``, ``txt``, ``rows`` or ``hf:wikitext2``, the protocol rather than the
    name) and the sha256 of the file it is read from."""
    path = source_file(source, data_dir)
    if path is None:
        return {"reader": HUB_WIKITEXT2, "file_sha256": ""}
    reader = "c4" if source == "c4" else ("txt" if path.suffix == ".txt" else "rows")
    return {"reader": reader, "file_sha256": file_sha256(path)}


def ppl_cache_parts(weights: str, eval_cfg: EvalConfig, data_dir: str | os.PathLike[str] | None = None) -> dict:
    """What an entry is made from (hashed into its name; stored in it as ``made_from`` for ``cache list``)."""
    settings = {k: v for k, v in ppl_settings(eval_cfg).items() if k != "source"}
    return {"version": PPL_CACHE_VERSION, "weights": weights, **settings, **data_key(eval_cfg.ppl_source, data_dir)}


def ppl_cache_key(weights: str, eval_cfg: EvalConfig, data_dir: str | os.PathLike[str] | None = None) -> str:
    """The entry name (first 20 hex digits of a sha256) for ``weights`` measured with ``eval_cfg``."""
    parts = ppl_cache_parts(weights, eval_cfg, data_dir)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def cached_perplexity(
    model: torch.nn.Module,
    tokenizer: Any,
    eval_cfg: EvalConfig,
    weights: str,
    cache_dir: str | os.PathLike[str] | None,
    data_dir: str | os.PathLike[str] | None = None,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """``eval.ppl_source`` perplexity of ``model``, read from the cache when there (``cache_dir=None``: no cache).

    Returns ``PerplexityResult.to_dict()`` plus ``seconds`` and ``cache_hit``."""
    path = None
    if cache_dir is not None:
        path = Path(cache_dir).expanduser() / "ppl" / f"{ppl_cache_key(weights, eval_cfg, data_dir)}.json"
        try:
            result = json.loads(path.read_text())
        except FileNotFoundError:
            pass
        except (OSError, json.JSONDecodeError) as err:
            log.warning("perplexity cache: unreadable entry %s (%s); measuring again", path, err)
        else:
            result.pop("made_from", None)
            return {**result, "cache_hit": True}
    start = time.perf_counter()
    res = perplexity(model, tokenizer, data_dir=data_dir, device=device, **ppl_settings(eval_cfg))
    result = {**res.to_dict(), "seconds": round(time.perf_counter() - start, 2), "cache_hit": False}
    if path is not None and math.isfinite(res.ppl):
        write_json_atomic(path, {**result, "made_from": ppl_cache_parts(weights, eval_cfg, data_dir)})
    return result
