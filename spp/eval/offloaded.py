"""Perplexity of a model that is not whole on any device, with its windows split over the ranks.

The same number as :func:`spp.eval.perplexity.perplexity`: rank ``r`` scores batches ``b mod world == r`` one
onloaded block at a time and the per-window NLL sums are added, so each rank pays about 1/N."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from spp.atomic import write_json_atomic
from spp.eval.config import EvalConfig
from spp.eval.perplexity import PerplexityResult, eval_windows, nll_sums, result_from_sums
from spp.eval.ppl_cache import ppl_cache_key, ppl_cache_parts, ppl_settings
from spp.eval.progress_lines import progress
from spp.models.block_runner import BlockRunner, buffers_on, in_eval_mode
from spp.models.offload import OffloadedModel

log = logging.getLogger(__name__)


@torch.no_grad()
def offloaded_perplexity(off: OffloadedModel, tokenizer: Any, source: str = "wikitext2", seqlen: int = 2048,
                         max_windows: int | None = None, batch_size: int = 1, data_dir: str | None = None,
                         sampling: str = "first") -> PerplexityResult:
    """Perplexity of ``off``'s model over every rank of ``off.ctx`` (arguments as ``perplexity``)."""
    ctx, model = off.ctx, off.model
    windows = eval_windows(tokenizer, source, seqlen, max_windows, batch_size, data_dir, sampling, model)
    batches = windows.batches(batch_size)
    mine = ctx.mine(len(batches))
    runner = BlockRunner(off)
    sums = torch.zeros(windows.ids.size(0), dtype=torch.float64, device=ctx.device)
    with in_eval_mode(model), buffers_on(model, ctx.device):
        hidden, calls = runner.head([batches[b] for b in mine])
        for i in progress(range(len(runner.layers)), f"ppl {windows.label}@{seqlen}: block", "block",
                          every_s=0, disable=not ctx.is_main):  # outside a terminal: a line per block
            with runner.block(i) as block:
                hidden = runner.run(block, hidden, calls[i])
        for b, logits in zip(mine, runner.logits(hidden, [batches[b] for b in mine]), strict=True):
            sums[b * batch_size : b * batch_size + batches[b].size(0)] = nll_sums(logits, batches[b]).double()
    ctx.all_reduce_(sums)  # each window has one contributor
    return result_from_sums(sums.cpu(), windows)


def _read_entry(path: Path | None) -> dict[str, Any] | None:
    """A perplexity cache entry without its ``made_from``; ``None`` when there is none (or it is unreadable)."""
    try:
        return {k: v for k, v in json.loads(path.read_text()).items() if k != "made_from"} if path else None
    except (OSError, json.JSONDecodeError) as err:
        if not isinstance(err, FileNotFoundError):
            log.warning("perplexity cache: unreadable entry %s (%s); measuring again", path, err)
        return None


def cached_offloaded_perplexity(off: OffloadedModel, tokenizer: Any, eval_cfg: EvalConfig, weights: str,
                                cache_dir: str | None, data_dir: str | None = None) -> dict[str, Any]:
    """:func:`offloaded_perplexity` through the perplexity cache (``cache_dir=None``: no cache): rank 0 reads and
    writes the entry, every rank gets the same result (measured by all of them on a miss). Returns the entry plus
    ``cache_hit`` and ``seconds``: this run's (on a hit, reading the entry; the measurement's own are
    ``cached_seconds``)."""
    ctx, start = off.ctx, time.perf_counter()
    path = (Path(cache_dir).expanduser() / "ppl" / f"{ppl_cache_key(weights, eval_cfg, data_dir)}.json"
            if ctx.is_main and cache_dir is not None else None)
    cached = ctx.on_main(lambda: _read_entry(path))
    if cached is not None:
        return {**cached, "seconds": round(time.perf_counter() - start, 2), "cached_seconds": cached.get("seconds"),
                "cache_hit": True}
    res = offloaded_perplexity(off, tokenizer, data_dir=data_dir, **ppl_settings(eval_cfg))
    result = {**res.to_dict(), "seconds": round(time.perf_counter() - start, 2), "cache_hit": False,
              "ranks": ctx.world}
    if path is not None and math.isfinite(res.ppl):
        write_json_atomic(path, {**result, "made_from": ppl_cache_parts(weights, eval_cfg, data_dir)})
    return result
