"""On-disk pruning cache entries: packed masks (+ SparseGPT weights) in safetensors and a manifest with checksums.

An entry is a directory ``<cache_dir>/pruning/<model identity>/<pruner>-<pattern>-<key hash>/`` holding
``state.safetensors`` (the bit-packed masks), for SparseGPT one ``weights-<k>.safetensors`` per decoder block, and
``manifest.json``. Every file is written to a temporary file then renamed; the manifest is written last and records
each file's sha256, so a partial or corrupted entry is detected by its reader (:class:`EntryReader`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from spp.atomic import publish

STATE_FILE = "state.safetensors"
MANIFEST_FILE = "manifest.json"
MASK_PREFIX = "mask::"
WEIGHT_PREFIX = "weight::"


class CorruptEntryError(RuntimeError):
    """A cache entry is incomplete, fails its checksum or does not fit the model."""


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    """Hex sha256 of a file, read in 16 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Bool mask -> uint8 tensor with 8 mask bits per byte."""
    return torch.from_numpy(np.packbits(mask.detach().cpu().numpy().reshape(-1)))


def unpack_mask(packed: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Inverse of ``pack_mask``."""
    numel = int(np.prod(shape))
    return torch.from_numpy(np.unpackbits(packed.numpy(), count=numel).astype(bool).reshape(shape))


def _save_atomic(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> str:
    """``save_file`` to a temporary file, rename it to ``path``; returns the file's sha256."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sha256_file(path)


def write_entry(
    entry: Path,
    masks: Mapping[str, torch.Tensor],
    weights: Iterable[dict[str, torch.Tensor]] | None,
    manifest: dict[str, Any],
) -> None:
    """Write an entry atomically: the packed masks, the weights one file per group (one decoder block: never the
    whole model serialised at once), then the manifest with every file's sha256.

    Args:
        entry: The entry directory.
        masks: Keep-masks by name (read one at a time; a :class:`~spp.pruning.masks.MaskSet` is never unpacked
            whole).
        weights: Groups of updated weights (SparseGPT), each written to its own ``weights-<k>.safetensors``.
        manifest: What the entry was made from (its key, timings, report).
    """
    entry.mkdir(parents=True, exist_ok=True)
    (entry / MANIFEST_FILE).unlink(missing_ok=True)
    shapes = {n: list(masks[n].shape) for n in masks}
    tensors = {MASK_PREFIX + n: pack_mask(masks[n]) for n in masks}
    files = {STATE_FILE: _save_atomic(tensors, entry / STATE_FILE, {"shapes": json.dumps(shapes)})}
    weight_files: dict[str, str] = {}
    for k, group in enumerate(weights or []):
        name = f"weights-{k:05d}.safetensors"
        files[name] = _save_atomic({WEIGHT_PREFIX + n: w.detach().cpu().contiguous() for n, w in group.items()},
                                   entry / name)
        weight_files.update({n: name for n in group})
    manifest = {**manifest, "state_sha256": files[STATE_FILE], "files": files, "weight_files": weight_files,
                "shapes": shapes}
    _atomic_write_bytes(entry / MANIFEST_FILE, json.dumps(manifest, indent=2, default=str).encode())


def read_manifest(entry: Path) -> dict[str, Any]:
    """Parse an entry's manifest.

    Raises:
        CorruptEntryError: missing or unparsable manifest.
    """
    try:
        return json.loads((entry / MANIFEST_FILE).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CorruptEntryError(f"cache entry {entry} has no readable manifest: {err}") from err


class EntryReader:
    """A finished entry, opened for reading one matrix at a time (no lock: a finished entry never changes).

    Opening checks the manifest and every file's sha256 against the one recorded when the entry was written
    (one reader per job: rank 0). :meth:`mask` and :meth:`weight` then read single tensors, so a 70B entry is
    never unpacked whole.

    Raises:
        CorruptEntryError: no manifest, a missing file, a checksum mismatch or an undecodable file.
    """

    def __init__(self, entry: Path) -> None:
        self.entry = entry
        self.manifest = read_manifest(entry)
        files = self.manifest.get("files") or {STATE_FILE: self.manifest.get("state_sha256")}
        for name, digest in files.items():
            if not (entry / name).is_file():
                raise CorruptEntryError(f"cache entry {entry} has no {name}")
            if sha256_file(entry / name) != digest:
                raise CorruptEntryError(f"cache entry {entry}: {name} fails its sha256 checksum")
        self._open: dict[str, Any] = {}
        self._state = self._file(STATE_FILE)
        self.weight_files: dict[str, str] = self.manifest.get("weight_files", {})
        self.shapes: dict[str, list[int]] = self.manifest.get("shapes", {})

    def _file(self, name: str) -> Any:
        if name not in self._open:
            try:
                self._open[name] = safe_open(str(self.entry / name), framework="pt")
            except Exception as err:  # noqa: BLE001 - any decoding error means a corrupt file
                raise CorruptEntryError(f"cache entry {self.entry}: cannot decode {name}: {err}") from err
        return self._open[name]

    def mask(self, name: str) -> torch.Tensor:
        """The bool keep-mask of ``name``."""
        key = MASK_PREFIX + name
        if name not in self.shapes or key not in self._state.keys():
            raise CorruptEntryError(f"cache entry {self.entry} holds no mask for {name}")
        return unpack_mask(self._state.get_tensor(key), self.shapes[name])

    def weight(self, name: str) -> torch.Tensor | None:
        """The stored (SparseGPT-updated) weight of ``name``, or ``None`` when the entry holds masks only."""
        key = WEIGHT_PREFIX + name
        if key in self._state.keys():  # entries written before the weights had files of their own
            return self._state.get_tensor(key)
        if name in self.weight_files:
            return self._file(self.weight_files[name]).get_tensor(key)
        return None


def entry_size(entry: Path) -> int:
    """Bytes on disk of an entry."""
    return sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())


def list_entries(cache_dir: Path) -> list[Path]:
    """All entry directories under ``cache_dir/pruning``."""
    root = Path(cache_dir) / "pruning"
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("*/*") if p.is_dir())


def remove_entry(entry: Path) -> None:
    """Delete an entry directory."""
    shutil.rmtree(entry, ignore_errors=True)
