"""Reconstruction as a phase after pruning, shared by ``prune.py`` and ``train.py``'s pruning callback.
:func:`probe` runs before pruning so the dense copy is made only when it will be used."""

from __future__ import annotations

import copy
import logging
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from spp.adapters.base import AdapterMethod
from spp.distributed import DistContext
from spp.errors import UserError
from spp.job_base import DEFAULT_LOCK_TIMEOUT_S
from spp.models.config import ModelConfig
from spp.models.offload import OffloadedModel
from spp.pruning.base import Pruner
from spp.pruning.cache import (
    READ_MARGIN_S,
    cache_entry_dir,
    main_decides,
    prune_cached,
    read_or_lock,
    write_entry,
)
from spp.pruning.cache.store import MANIFEST_FILE, CorruptEntryError, EntryWriter, read_manifest
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import PruneResult, local_context, prune_offloaded
from spp.pruning.masks import MaskSet
from spp.pruning.reconstruction import cache
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.engine import ReconstructResult, reconstruct_offloaded
from spp.pruning.resolve import prunes

log = logging.getLogger(__name__)

Keys = tuple[tuple[dict[str, Any], str], tuple[dict[str, Any], str]]
"""The pruning cache key and the reconstruction's, each ``(key, sha256 digest)``."""


@dataclass
class Probe:
    """Where a reconstruction's entry is and whether it was finished when looked up (rank 0's view, shared)."""

    cfg: ReconstructConfig
    entry: Path | None = None
    key: dict[str, Any] | None = None
    digest: str | None = None
    hit: bool = False

    @property
    def needs_dense(self) -> bool:
        """Reconstruction will run (the dense model is needed)."""
        return self.cfg.enabled and not self.hit


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` in eval mode (no parameter requires grad): real weights on rank 0, a ``meta``
    skeleton where ``model`` is one (tied parameters stay tied)."""
    dense = copy.deepcopy(model)
    dense.requires_grad_(False)
    return dense.eval()


def probe(cfg: ReconstructConfig, model_cfg: ModelConfig, pruner: PrunerConfig, sparsity: SparsityConfig,
          calibration: CalibrationConfig, cache_dir: str | None, data_dir: str | None, ctx: DistContext, *,
          form: AdapterMethod | None = None, keys: Keys | None = None) -> Probe:
    """The entry of this reconstruction (none without ``cache_dir`` or pruning) and whether it is finished.
    Rank 0 decides, every rank learns it; ``keys`` are computed unless the caller (a job's ``Run``) has them."""
    found = Probe(cfg)
    if not cfg.enabled or cache_dir is None or not prunes(pruner, sparsity):
        return found

    def decide() -> Probe:  # rank 0; an error computing the keys reaches every rank at once
        (pkey, _), (found.key, found.digest) = keys or cache.pruning_keys(model_cfg, pruner, sparsity, calibration,
                                                                           cfg, data_dir, form)
        found.entry = cache_entry_dir(cache_dir, pkey, found.digest, form="blockwise")
        try:
            found.hit = (found.entry / MANIFEST_FILE).is_file() and read_manifest(found.entry).get("key") == found.key
        except CorruptEntryError:
            found.hit = False
        return found
    return ctx.on_main(decide, (UserError, OSError), long_wait=True)


def reconstruct_phase(off: OffloadedModel, dense: nn.Module | None, tokenizer: PreTrainedTokenizerBase,
                      masks: MaskSet, pruner: PrunerConfig, found: Probe, data_dir: str | None = None,
                      lock_timeout_s: float = 7200.0, form: AdapterMethod | None = None) -> ReconstructResult:
    """Reconstruct ``off`` (pruned) against ``dense`` (``None`` when ``found.hit``), through the cache when
    ``found.entry`` is set; every rank calls it."""
    ctx = off.ctx
    ctx.allow_long_waits(lock_timeout_s + READ_MARGIN_S)
    if found.hit:
        return _hit(main_decides(ctx, lambda: cache.load_finished(off, found.entry, found.key))[1], ctx)
    if dense is None:
        raise ValueError("reconstruct_phase: the dense model is needed (the probe found no finished entry)")
    dense_off = OffloadedModel(dense, ctx)
    try:
        return _run(off, dense_off, tokenizer, masks, (pruner, form), found, data_dir, lock_timeout_s)
    finally:
        dense_off.restore()


def _run(off: OffloadedModel, dense: OffloadedModel, tokenizer: PreTrainedTokenizerBase, masks: MaskSet,
         pruning: tuple[PrunerConfig, AdapterMethod | None], found: Probe, data_dir: str | None,
         lock_timeout_s: float) -> ReconstructResult:
    ctx = off.ctx
    pruner, form = pruning
    if found.entry is None:
        return reconstruct_offloaded(off, dense, tokenizer, masks, pruner.targets, found.cfg, data_dir, form=form)
    with ExitStack() as stack:
        hit_found, hit = main_decides(ctx, lambda: read_or_lock(lambda: cache.load(off, found.entry, found.key),
                                                                found.entry, stack, lock_timeout_s))
        if hit_found:  # another job wrote it meanwhile
            return _hit(hit, ctx)
        writer = EntryWriter(found.entry) if ctx.is_main else None
        result = write_entry(ctx, writer, "reconstruction",
                             lambda: reconstruct_offloaded(off, dense, tokenizer, masks, pruner.targets, found.cfg,
                                                           data_dir, on_block=cache.block_writer(off, writer),
                                                           form=form),
                             lambda result: (masks, found.key, cache.manifest_record(result)))
    result.cache_path = str(found.entry) if ctx.is_main else None
    return result


def _hit(hit: ReconstructResult | None, ctx: DistContext) -> ReconstructResult:
    """A cache hit's result: rank 0's (logged), an empty one elsewhere."""
    if ctx.is_main and hit is not None:
        log.info("reconstruction: cache hit (%s), %d blocks applied in %.1f s", hit.cache_path, len(hit.blocks),
                 hit.timings.get("cache_load", 0.0))
    return hit or ReconstructResult(cache_hit=True)


def get_or_reconstruct(model: nn.Module, tokenizer: PreTrainedTokenizerBase, model_cfg: ModelConfig,
                       pruner: PrunerConfig, sparsity: SparsityConfig, calibration: CalibrationConfig,
                       cfg: ReconstructConfig, cache_dir: str | None, data_dir: str | None = None, device: Any = None,
                       *, ctx: DistContext | None = None, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
                       method: Pruner | None = None,
                       form: AdapterMethod | None = None) -> tuple[PruneResult, ReconstructResult | None]:
    """Prune a whole in-memory ``model`` in place, then reconstruct it when ``cfg`` is enabled, through both caches
    (``cache_dir=None``: neither), on every rank of ``ctx`` (default: this process on ``device``); the dense copy is
    taken before pruning, only when no finished reconstruction entry exists. Returns the prune result and the
    reconstruction's (``prune.py``; ``eval.py`` with ``reconstruct=blockwise``: the base a reconstructed run's adapter
    was trained on). ``method``, ``form``: the resolved pruner and form, or None."""
    ctx = ctx if ctx is not None else local_context(device)
    found = probe(cfg, model_cfg, pruner, sparsity, calibration, cache_dir, data_dir, ctx, form=form)
    dense = frozen_copy(model) if found.needs_dense else None
    off = OffloadedModel(model, ctx)
    try:
        result = (prune_cached(off, tokenizer, model_cfg, pruner, sparsity, calibration, cache_dir, data_dir,
                               lock_timeout_s=lock_timeout_s, method=method)
                  if cache_dir is not None else
                  prune_offloaded(off, tokenizer, pruner, sparsity, calibration, data_dir, method=method))
        if not cfg.enabled:
            return result, None
        return result, reconstruct_phase(off, dense, tokenizer, result.masks, pruner, found, data_dir, lock_timeout_s,
                                         form)
    finally:
        off.restore()
