"""The pruning cache: prune once per (model, pruner, sparsity, calibration, code version), re-use afterwards.

Concurrent jobs with the same key prune once: the check-miss-prune-write sequence holds an exclusive file lock
on ``<entry>.lock``, so the others wait (logging that they do), then load the entry the first one wrote.
``python -m spp.pruning.cache list|clear`` lists or deletes entries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from torch import nn
from transformers import PreTrainedTokenizerBase

from spp.models.config import ModelConfig
from spp.models.loading import model_identity
from spp.pruning.cache.store import (
    CorruptEntryError,
    list_entries,
    read_entry,
    remove_entry,
    sha256_file,
    write_entry,
)
from spp.pruning.calibration_data import resolve_calibration_file
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import PruneResult, prune_model, validate_for_model
from spp.pruning.report import build_report
from spp.pruning.targets import target_linears

PRUNING_CODE_VERSION = "1"
"""Bump when a change to the pruning code changes its results: old cache entries then stop matching."""

log = logging.getLogger(__name__)

__all__ = [
    "PRUNING_CODE_VERSION",
    "cache_entry_dir",
    "cache_key",
    "get_or_prune",
    "list_entries",
    "remove_entry",
]


def _pruner_key(pruner: PrunerConfig) -> dict[str, Any]:
    key: dict[str, Any] = {"name": pruner.name, "targets": sorted(pruner.targets)}
    if pruner.needs_calibration:
        key["true_sequential"] = pruner.true_sequential
    if pruner.name == "sparsegpt":
        key.update(blocksize=pruner.blocksize, percdamp=pruner.percdamp)
    if pruner.name == "dsnot":
        key.update(
            initial_method=pruner.initial_method,
            max_cycles=pruner.max_cycles,
            update_threshold=pruner.update_threshold,
            pow_of_var_regrowing=pruner.pow_of_var_regrowing,
            same_sign_check=pruner.same_sign_check,
            refine_targets=sorted(pruner.refine_targets),
        )
        if pruner.initial_method == "sparsegpt":
            key["percdamp"] = pruner.percdamp
    return key


def cache_key(
    model_cfg: ModelConfig,
    pruner: PrunerConfig,
    sparsity: SparsityConfig,
    calibration: CalibrationConfig,
    data_dir: str | None = None,
) -> tuple[dict[str, Any], str]:
    """The fields that determine a pruning result, and their sha256 (hex).

    Includes the model identity, the pruner settings it uses, the pattern (not its display name), the calibration
    settings and the content hash of the calibration file (activation-aware pruners only), and the code version.
    """
    key: dict[str, Any] = {
        "code_version": PRUNING_CODE_VERSION,
        "model": model_identity(model_cfg),
        "pruner": _pruner_key(pruner),
        "sparsity": {"kind": sparsity.kind, "ratio": sparsity.target_ratio, "n": sparsity.n, "m": sparsity.m},
    }
    if pruner.needs_calibration:
        calib = dataclasses.asdict(calibration)
        calib.pop("batch_size")
        calib["file_sha256"] = sha256_file(resolve_calibration_file(calibration, data_dir))
        key["calibration"] = calib
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return key, digest


def pattern_label(pattern: dict[str, Any]) -> str:
    """``unstructured50``, ``unstructured62.5`` or ``nm2_4``: the key's pattern (``cache_key(...)[0]["sparsity"]``)."""
    if pattern["kind"] == "nm":
        return f"nm{pattern['n']}_{pattern['m']}"
    return f"{pattern['kind']}{100 * float(pattern['ratio']):g}"


def cache_entry_dir(cache_dir: str | Path, key: dict[str, Any], digest: str) -> Path:
    """Directory of the entry for ``key``: ``<model identity>/<pruner>-<pattern>-<digest[:16]>``.

    Named from the key itself, not from display names, so ``sparsity=unstructured50`` and ``sparsity=unstructured
    sparsity.ratio=0.5`` share one entry, and ``sparsity=unstructured50 sparsity.ratio=0.75`` is labelled 75.
    """
    label = f"{key['pruner']['name']}-{pattern_label(key['sparsity'])}-{digest[:16]}"
    return Path(cache_dir).expanduser() / "pruning" / key["model"] / label


def _apply_cached(
    model: nn.Module, targets: list[str], masks: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    linears = target_linears(model, targets)
    if set(linears) != set(masks):
        raise CorruptEntryError("cache entry holds different layers than the model; it does not fit this model")
    out = {}
    with torch.no_grad():
        for name, linear in linears.items():
            mask = masks[name]
            if tuple(mask.shape) != tuple(linear.weight.shape):
                raise CorruptEntryError(f"cache entry mask for {name} has shape {tuple(mask.shape)}, "
                                        f"the model's weight {tuple(linear.weight.shape)}")
            if name in weights:
                linear.weight.copy_(weights[name].to(linear.weight.device, linear.weight.dtype))
            mask = mask.to(linear.weight.device)
            linear.weight.masked_fill_(~mask, 0)
            out[name] = mask
    return out


@contextmanager
def entry_lock(entry: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<entry>.lock`` (``fcntl.flock`` through ``filelock``); log while waiting for it."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(f"{entry}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("pruning cache: another job holds %s.lock (pruning the same key); waiting for it", entry)
        start = time.perf_counter()
        lock.acquire()
        log.info("pruning cache: lock acquired after %.1f s", time.perf_counter() - start)
    try:
        yield
    finally:
        lock.release()


def _load_entry(
    model: nn.Module, entry: Path, key: dict[str, Any], pruner: PrunerConfig, sparsity: SparsityConfig,
    linears: dict[str, nn.Linear],
) -> PruneResult | None:
    """Apply a valid entry to ``model`` and return its result; ``None`` (entry removed if corrupt) on a miss."""
    if not entry.exists():
        return None
    t0 = time.perf_counter()
    try:
        manifest, masks, weights = read_entry(entry)
        if manifest.get("key") != key:
            raise CorruptEntryError(f"cache entry {entry} was written for other settings")
        masks = _apply_cached(model, pruner.targets, masks, weights)
    except CorruptEntryError as err:
        log.warning("pruning cache: %s; rebuilding it", err)
        remove_entry(entry)
        return None
    timings = {"cache_load": time.perf_counter() - t0, "total": time.perf_counter() - t0}
    report = build_report({n: m.weight for n, m in linears.items()}, sparsity)
    report.overall["timings"] = {"original": manifest.get("timings", {}), **timings}
    return PruneResult(masks, report, timings, cache_hit=True, cache_path=str(entry))


def get_or_prune(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    model_cfg: ModelConfig,
    pruner: PrunerConfig,
    sparsity: SparsityConfig,
    calibration: CalibrationConfig,
    cache_dir: str | Path,
    data_dir: str | None = None,
    device: str | torch.device | None = None,
) -> PruneResult:
    """Prune ``model`` in place, re-using the cache entry for these settings when a valid one exists.

    On a hit the stored masks (and SparseGPT's updated weights) are applied to the model with no calibration
    forward pass. On a miss, or when the entry is partial or fails its checksum, the model is pruned and the
    entry (re)written atomically. Check, prune and write hold the entry's file lock (:func:`entry_lock`), so
    concurrent jobs with the same key prune once. ``pruner=none`` or ``sparsity=dense`` is a no-op with
    all-True masks and no cache entry.
    """
    linears = validate_for_model(model, pruner, sparsity, calibration)
    if sparsity.is_dense or pruner.name == "none":
        return prune_model(model, tokenizer, pruner, sparsity, calibration, data_dir, device)
    key, digest = cache_key(model_cfg, pruner, sparsity, calibration, data_dir)
    entry = cache_entry_dir(cache_dir, key, digest)
    with entry_lock(entry):
        cached = _load_entry(model, entry, key, pruner, sparsity, linears)
        if cached is not None:
            return cached
        result = prune_model(model, tokenizer, pruner, sparsity, calibration, data_dir, device)
        weights = {n: m.weight for n, m in linears.items()} if pruner.name == "sparsegpt" else None
        write_entry(
            entry,
            result.masks,
            weights,
            {"key": key, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "timings": result.timings,
             "overall": {k: v for k, v in result.report.overall.items() if k != "timings"}},
        )
    result.cache_path = str(entry)
    return result
