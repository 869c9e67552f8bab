"""The reconstruction cache: one entry per (pruning key, reconstruction settings), so a sweep reuses it.
Entries sit beside the pruning entries (``...-blockwise-<key hash>/``) in the same format."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from spp.adapters.base import AdapterMethod
from spp.errors import UserError
from spp.models.config import ModelConfig
from spp.models.offload import OffloadedModel
from spp.paths import file_sha256, json_sha256
from spp.pruning.cache import cache_key, json_ready
from spp.pruning.cache.store import CorruptEntryError, EntryWriter, open_for_key, remove_entry
from spp.pruning.calibration_data import resolve_calibration_file, sampling_of
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.engine import ReconstructResult, calibration_of, form_config, learning_rate

RECONSTRUCT_CODE_VERSION = "1"
"""Bump when a change to the reconstruction code changes its results: old entries then stop matching."""

log = logging.getLogger(__name__)

KeyDigest = tuple[dict[str, Any], str]
"""A cache key and its sha256 (hex)."""


def reconstruct_key(pruning_key: dict[str, Any], pruning_digest: str, cfg: ReconstructConfig,
                    data_dir: str | None, form: AdapterMethod | None = None) -> tuple[dict[str, Any], str]:
    """The fields that determine a reconstruction, and their sha256: the pruning key's digest, every
    ``reconstruct.*`` field, the form's resolved adapter options, the calibration file's sha256, the code version
    (``form``: the resolved form, or None)."""
    fields = {f.name: json_ready(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name != "name"}
    fields["lr"] = learning_rate(cfg, form)  # null and the form's own rate written out are one reconstruction
    calibration = calibration_of(cfg)
    fields["sampling"] = sampling_of(calibration)
    key = {
        "code_version": RECONSTRUCT_CODE_VERSION,
        "model": pruning_key["model"],
        "pruning": pruning_digest,
        "reconstruct": fields,
        "form": json_ready(dataclasses.asdict(form_config(cfg, form))),
        "file_sha256": file_sha256(resolve_calibration_file(calibration, data_dir)),
    }
    return key, json_sha256(key)


def pruning_keys(model_cfg: ModelConfig, pruner: PrunerConfig, sparsity: SparsityConfig,
                 calibration: CalibrationConfig, cfg: ReconstructConfig, data_dir: str | None,
                 form: AdapterMethod | None = None) -> tuple[KeyDigest, KeyDigest | None]:
    """The pruning cache key and the reconstruction's (``None`` unless ``cfg`` is enabled), each ``(key, digest)``:
    the one place a job's ``Run`` and :func:`~spp.pruning.reconstruction.phase.probe` compute them."""
    key, digest = cache_key(model_cfg, pruner, sparsity, calibration, data_dir)
    return (key, digest), (reconstruct_key(key, digest, cfg, data_dir, form) if cfg.enabled else None)


def load(off: OffloadedModel, entry: Path, key: dict[str, Any]) -> ReconstructResult | None:
    """Rank 0: apply a finished entry's block parameters to the home weights; ``None`` when there is none, or it was
    written for other settings or fails its checks before anything is applied."""
    t0 = time.perf_counter()
    try:
        reader = open_for_key(entry, key)
        if reader is None:
            return None
        names = list(reader.weight_files)
        missing = [n for n in names if off.canonical(n) not in off.home]
        if missing or not names:
            raise CorruptEntryError(f"reconstruction cache entry {entry} does not fit this model")
    except (CorruptEntryError, KeyError) as err:
        log.warning("reconstruction cache: %s; reconstructing again", err)
        return None
    try:  # a weights file is checked when first read: some weights are applied by then, so no reconstructing again
        with torch.no_grad():
            for name in names:
                home = off.home[off.canonical(name)]
                stored = reader.weight(name)
                if tuple(stored.shape) != tuple(home.shape):
                    raise CorruptEntryError(f"reconstruction cache entry {entry}: {name} has another shape")
                home.copy_(stored.to(home.dtype))
    except CorruptEntryError as err:
        remove_entry(entry)
        raise failed_entry(entry, f" ({err})") from err
    manifest = reader.manifest
    timings = {"cache_load": round(time.perf_counter() - t0, 3), "original": manifest.get("timings", {})}
    return ReconstructResult(manifest.get("blocks", []), timings, manifest.get("calibration"), cache_hit=True,
                             cache_path=str(entry), lr=(key.get("reconstruct") or {}).get("lr"))


def load_finished(off: OffloadedModel, entry: Path, key: dict[str, Any]) -> ReconstructResult:
    """Rank 0: :func:`load` of an entry the probe found finished; one line when it fails its checks (the entry
    removed, so that the run the line asks for reconstructs)."""
    hit = load(off, entry, key)
    if hit is None:
        remove_entry(entry)
        raise failed_entry(entry)
    return hit


def failed_entry(entry: Path, detail: str = "") -> UserError:
    """The one line that ends a job whose finished entry failed its checks once read (the entry is removed)."""
    return UserError(f"the reconstruction cache entry {entry} failed its checks while it was read{detail}",
                     "run the job again: it reconstructs afresh and rewrites the entry", key="cache_dir")


def block_writer(off: OffloadedModel, writer: EntryWriter | None) -> Callable[[str], None] | None:
    """Rank 0's ``on_block``: hands the home parameters of block ``prefix`` (``model.layers.3``) to ``writer`` (none
    without a writer)."""
    if writer is None:
        return None
    return lambda prefix: writer.add_weights({n: off.home[n] for n in off.names_under(prefix)})


def manifest_record(result: ReconstructResult) -> dict[str, Any]:
    """The manifest's fields beside the key, read back by :func:`load`."""
    return {"blocks": result.blocks, "timings": result.timings, "calibration": result.calibration}
