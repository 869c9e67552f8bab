"""The perplexity cache's keys (:mod:`spp.eval.offloaded` reads and writes it), so a sweep measures the dense and
the pruned model once.

The key holds the sha256 of the resolved data file, not the source's name; non-finite results are not cached."""

from __future__ import annotations

import os
from typing import Any

from spp.eval.config import EvalConfig
from spp.eval.perplexity import HUB_WIKITEXT2, source_file
from spp.paths import file_sha256, json_sha256

PPL_CACHE_VERSION = "3"
"""Bump when a change to the perplexity code changes its results (version 1 keyed on the source name; version 2
entries hold no per-window NLL, interval or window sampling)."""


def ppl_settings(eval_cfg: EvalConfig) -> dict[str, Any]:
    """The :func:`spp.eval.offloaded.offloaded_perplexity` keyword arguments held by the ``eval`` group."""
    return {
        "source": eval_cfg.ppl_source,
        "seqlen": int(eval_cfg.seqlen),
        "max_windows": eval_cfg.max_windows,
        "batch_size": int(eval_cfg.batch_size),
        "sampling": eval_cfg.window_sampling,
    }


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
    return json_sha256(ppl_cache_parts(weights, eval_cfg, data_dir))[:20]
