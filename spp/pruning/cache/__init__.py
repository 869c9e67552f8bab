"""The pruning cache: prune once per (model, pruner, sparsity, calibration, code version), re-use afterwards.
Readers take no lock; a writer holds ``<entry>.lock`` and other ranks wait on the job's wait group, never on the
training process group. ``python -m spp.pruning.cache list|clear`` lists or deletes entries."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from spp.atomic import is_disk_full
from spp.distributed import DistContext
from spp.errors import UserError
from spp.job_base import DEFAULT_LOCK_TIMEOUT_S
from spp.models.config import ModelConfig
from spp.models.loading import model_identity
from spp.models.offload import OffloadedModel
from spp.paths import file_sha256, json_sha256
from spp.pruning.base import Pruner
from spp.pruning.cache.lock import check_locks_span_nodes, entry_lock
from spp.pruning.cache.store import (
    CorruptEntryError,
    EntryReader,
    EntryWriter,
    open_for_key,
    remove_entry,
)
from spp.pruning.calibration_data import resolve_calibration_file, sampling_of
from spp.pruning.config import CACHE_KEY, UNORDERED, CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import PruneResult, prune_offloaded, validate_for_model
from spp.pruning.masks import MaskSet, ZeroPattern, kept_zero_indices
from spp.pruning.patterns import sparsity_summary
from spp.pruning.registry import needs_calibration, resolve_config
from spp.pruning.report import report_from_layers

PRUNING_CODE_VERSION = "2"  # 2: SparseGPT's Hessian summed exactly (the same masks on any number of ranks)
"""Bump when a change to the pruning code changes its results: old cache entries then stop matching."""

READ_MARGIN_S = 3600.0
"""Beyond ``cache_lock_timeout_s``: how long rank 0 may take alone to read the weights, apply or finish an entry."""

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "PRUNING_CODE_VERSION",
    "READ_MARGIN_S",
    "cache_entry_dir",
    "cache_key",
    "entry_lock",
    "main_decides",
    "prune_cached",
    "pruner_key",
    "remove_entry",
    "write_entry",
]


def pruner_key(pruner: PrunerConfig) -> dict[str, Any]:
    """The pruner's part of the cache key: every field of its config unless its metadata leaves it out with a
    reason, so a new field is in the key until someone says why not (``tests/test_cache_keys.py``)."""
    cfg = resolve_config(pruner)
    key: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        rule = f.metadata.get(CACHE_KEY, True)
        if rule is False or (callable(rule) and not rule(cfg)):
            continue
        value = json_ready(getattr(cfg, f.name))
        key[f.name] = sorted(value) if f.metadata.get(UNORDERED) else value
    return key


def json_ready(value: Any) -> Any:
    """A config value as JSON writes it the same way every time (Enums by value, tuples as lists, dicts sorted)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in sorted(value.items())}
    return value


def cache_key(
    model_cfg: ModelConfig,
    pruner: PrunerConfig,
    sparsity: SparsityConfig,
    calibration: CalibrationConfig,
    data_dir: str | None = None,
) -> tuple[dict[str, Any], str]:
    """The fields that determine a pruning result (the calibration file's content hash only for activation-aware
    pruners), and their sha256 (hex)."""
    key: dict[str, Any] = {
        "code_version": PRUNING_CODE_VERSION,
        "model": model_identity(model_cfg),
        "pruner": pruner_key(pruner),
        "sparsity": {"kind": sparsity.kind, "ratio": sparsity.target_ratio, "n": sparsity.n, "m": sparsity.m},
    }
    if sparsity.layerwise == "rmi":
        key["sparsity"].update(layerwise=sparsity.layerwise, rmi_delta=sparsity.rmi_spread)
    elif sparsity.layerwise != "none":  # only then: the keys of uniform patterns stay as they were
        key["sparsity"].update(layerwise=sparsity.layerwise, owl_lambda=sparsity.owl_lambda, owl_m=sparsity.owl_m)
    if needs_calibration(pruner, sparsity):
        calib = dataclasses.asdict(calibration)
        calib.pop("batch_size")
        calib["sampling"] = sampling_of(calibration)  # null is the source's default: the same draw, the same key
        calib["file_sha256"] = file_sha256(resolve_calibration_file(calibration, data_dir))
        key["calibration"] = calib
    return key, json_sha256(key)


def pattern_label(pattern: dict[str, Any]) -> str:
    """``unstructured50``, ``unstructured62.5`` or ``nm2_4``: the key's pattern (``cache_key(...)[0]["sparsity"]``)."""
    if pattern["kind"] == "nm":
        return f"nm{pattern['n']}_{pattern['m']}"
    owl = f"-{pattern['layerwise']}" if pattern.get("layerwise", "none") != "none" else ""
    return f"{pattern['kind']}{100 * float(pattern['ratio']):g}{owl}"


def cache_entry_dir(cache_dir: str | Path, key: dict[str, Any], digest: str, form: str = "") -> Path:
    """Directory of the entry for ``key``: ``<model identity>/<pruner>-<pattern>[-<form>]-<digest[:16]>`` (``form``:
    a reconstruction's entry beside it). Named from the key, not display names, so equal patterns written two ways
    share one entry."""
    label = f"{key['pruner']['name']}-{pattern_label(key['sparsity'])}{'-' + form if form else ''}-{digest[:16]}"
    return Path(cache_dir).expanduser() / "pruning" / key["model"] / label


def _check_shapes(reader: EntryReader, linears: dict[str, nn.Linear]) -> None:
    if set(reader.shapes) != set(linears):
        raise CorruptEntryError("cache entry holds different layers than the model; it does not fit this model")
    for name, linear in linears.items():
        if tuple(reader.shapes[name]) != tuple(linear.weight.shape):
            raise CorruptEntryError(f"cache entry mask for {name} has shape {tuple(reader.shapes[name])}, "
                                    f"the model's weight {tuple(linear.weight.shape)}")


def _load_entry(off: OffloadedModel, entry: Path, key: dict[str, Any], sparsity: SparsityConfig,
                linears: dict[str, nn.Linear]) -> PruneResult | None:
    """Apply a finished entry to rank 0's home weights, one matrix at a time (no lock); ``None`` on a miss or an
    entry that fails its checks (nothing applied then: every check runs before the first weight changes)."""
    t0 = time.perf_counter()
    try:
        reader = open_for_key(entry, key)
        if reader is None:
            return None
        _check_shapes(reader, linears)
    except CorruptEntryError as err:
        log.warning("pruning cache: %s; pruning again", err)
        return None
    try:
        masks, kept, layers = _apply(off, reader, linears, sparsity)
    except CorruptEntryError as err:  # a weights file, found bad after earlier blocks were applied
        remove_entry(entry)
        raise UserError(f"pruning cache: {err}, found after part of the entry was applied to the weights; the entry "
                        "was removed", "run the job again: it prunes afresh and rewrites the entry",
                        key="cache_dir") from err
    timings = {"cache_load": time.perf_counter() - t0, "total": time.perf_counter() - t0}
    report = report_from_layers(layers, sparsity, timings={"original": reader.manifest.get("timings", {}), **timings},
                                calibration=reader.manifest.get("overall", {}).get("calibration"))  # the entry's draw
    return PruneResult(masks, report, timings, cache_hit=True, cache_path=str(entry), zeros=ZeroPattern(masks, kept))


def _apply(off: OffloadedModel, reader: EntryReader, linears: dict[str, nn.Linear],
           sparsity: SparsityConfig) -> tuple[MaskSet, dict[str, torch.Tensor], dict[str, Any]]:
    """Apply the entry to rank 0's home weights, one matrix at a time: masks, kept zeros and report rows."""
    masks, kept, layers = MaskSet(), {}, {}
    with torch.no_grad():
        for name in linears:
            weight = off.home[off.canonical(f"{name}.weight")]
            mask, stored = reader.mask(name), reader.weight(name)
            if stored is not None:
                weight.copy_(stored.to(weight.dtype))
            weight.masked_fill_(~mask, 0)
            masks.set(name, mask)
            kept[name] = kept_zero_indices(name, mask, weight)
            layers.update(sparsity_summary({name: weight}, *sparsity.nm_pair)["layers"])
    return masks, kept, layers


def read_or_lock(read: Callable[[], T | None], entry: Path, stack: ExitStack, timeout_s: float) -> T | None:
    """Rank 0: ``read()``'s result when the entry is finished (read lock-free), else ``None`` with the writer's lock
    held in ``stack``; read again under the lock (another job may have written it meanwhile), a stale or corrupt
    entry is then removed."""
    found = read()
    if found is not None:
        return found
    stack.enter_context(entry_lock(entry, timeout_s))
    found = read()
    if found is not None:
        stack.close()
        return found
    remove_entry(entry)
    return None


def main_decides(ctx: DistContext, work: Callable[[], T | None]) -> tuple[bool, T | None]:
    """``work()`` on rank 0, its result kept there (``None`` elsewhere): every rank learns whether it returned one, or
    raises the ``UserError`` or ``OSError`` (a missing calibration file hashed for a key) it raised
    (:meth:`DistContext.on_main`, over the wait group: no rank waits it out)."""
    kept: list[T | None] = [None]

    def run() -> bool:
        kept[0] = work()
        return kept[0] is not None

    return ctx.on_main(run, (UserError, OSError), long_wait=True), kept[0]


def prune_cached(
    off: OffloadedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    model_cfg: ModelConfig,
    pruner: PrunerConfig,
    sparsity: SparsityConfig,
    calibration: CalibrationConfig,
    cache_dir: str | Path,
    data_dir: str | None = None,
    *,
    keep_masks: bool = False,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    method: Pruner | None = None,
    entry_key: tuple[dict[str, Any], str] | None = None,
) -> PruneResult:
    """Prune ``off`` on every rank of ``off.ctx``, or apply the cache entry for these settings (rank 0 reads it).
    On a miss rank 0 holds the writer lock and writes blocks in the background; decisions travel over the wait group
    (timeout ``lock_timeout_s`` + :data:`READ_MARGIN_S`) so no rank hits the training group's timeout."""
    ctx = off.ctx
    linears, method = validate_for_model(off.model, pruner, sparsity, calibration, method)
    if method is None:
        return prune_offloaded(off, tokenizer, pruner, sparsity, calibration, data_dir, keep_masks)
    ctx.allow_long_waits(lock_timeout_s + READ_MARGIN_S)
    check_locks_span_nodes(ctx, Path(cache_dir).expanduser() / "pruning")
    with ExitStack() as stack:
        where: list[tuple[dict[str, Any], Path]] = []  # rank 0's key and entry, found inside its decision

        def decide() -> PruneResult | None:
            key, digest = entry_key or cache_key(model_cfg, pruner, sparsity, calibration, data_dir)
            where.append((key, cache_entry_dir(cache_dir, key, digest)))
            return read_or_lock(lambda: _load_entry(off, where[0][1], key, sparsity, linears), where[0][1], stack,
                                lock_timeout_s)
        found, hit = main_decides(ctx, decide)
        key, entry = where[0] if where else ({}, None)
        if found:  # rank 0 holds the result; the others an empty one (rank 0's masks with keep_masks)
            masks = off.ctx.broadcast_object(hit and hit.masks, long_wait=True) if keep_masks else MaskSet()
            return hit or PruneResult(masks, report_from_layers({}, sparsity), cache_hit=True)
        writer = EntryWriter(entry) if ctx.is_main else None
        result = _prune_writing(off, tokenizer, (pruner, method), sparsity, calibration, data_dir, keep_masks, writer,
                                linears, key)
        result.cache_path = str(entry) if entry is not None else None
    return result


def _prune_writing(off: OffloadedModel, tokenizer: PreTrainedTokenizerBase | None,
                   pruning: tuple[PrunerConfig, Pruner], sparsity: SparsityConfig, calibration: CalibrationConfig,
                   data_dir: str | None, keep_masks: bool, writer: EntryWriter | None,
                   linears: dict[str, nn.Linear], key: dict[str, Any]) -> PruneResult:
    """:func:`prune_offloaded` with ``pruning`` (the config and its resolved pruner) through :func:`write_entry`,
    rank 0 handing each finished block's weights to ``writer`` (pruners that update weights)."""
    pruner, method = pruning
    on_block = None
    if writer is not None and method.updates_weights:
        def on_block(prefix: str) -> None:
            writer.add_weights({n: off.home[off.canonical(f"{n}.weight")] for n in linears
                                if n.startswith(prefix + ".")})
    return write_entry(off.ctx, writer, "pruning",
                       lambda: prune_offloaded(off, tokenizer, pruner, sparsity, calibration, data_dir, keep_masks,
                                               on_block=on_block, method=method),
                       lambda result: (result.masks, key, {"timings": result.timings, "overall": {
                           k: v for k, v in result.report.overall.items() if k != "timings"}}))


def write_entry(ctx: DistContext, writer: EntryWriter | None, what: str, compute: Callable[[], T],
                record: Callable[[T], tuple[MaskSet, dict[str, Any], dict[str, Any]]]) -> T:
    """Run ``compute()`` on every rank (rank 0 streaming blocks to ``writer``), then rank 0 finishes the entry with
    ``record(result)`` (masks, key, manifest fields); every rank learns the outcome over the wait group. The
    unfinished entry is removed on any error; a full disk raises ``UserError``, another write error ``RuntimeError``,
    on all ranks (``what``: the cache, ``pruning`` or ``reconstruction``)."""
    try:
        result = compute()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    error: Exception | None = None
    if writer is not None:
        try:
            writer.finish(*record(result))
        except Exception as err:  # noqa: BLE001 - every rank must learn of it, not wait at the next collective
            writer.abort()
            error = (UserError(f"the disk filled up while writing the {what} cache entry {writer.entry} ({err}); "
                               "nothing half-written was kept", "free space under cache_dir, or point cache_dir= "
                               "at a disk with room", key="cache_dir")
                     if is_disk_full(err) else RuntimeError(f"writing the {what} cache entry {writer.entry} "
                                                            f"failed: {type(err).__name__}: {err}"))
    error = ctx.broadcast_object(error, long_wait=True)
    if error is not None:
        raise error
    return result
