"""On-disk pruning cache entries: packed masks (+ SparseGPT weights) in safetensors and a manifest with checksums.
``manifest.json`` is written last with every file's sha256, so a partial or corrupted entry is detected."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from spp.atomic import write_file_atomic
from spp.paths import file_sha256

STATE_FILE = "state.safetensors"
MANIFEST_FILE = "manifest.json"
MASK_PREFIX = "mask::"
WEIGHT_PREFIX = "weight::"


class CorruptEntryError(RuntimeError):
    """A cache entry is incomplete, fails its checksum or does not fit the model."""


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    write_file_atomic(path, write)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """Bool mask -> uint8 tensor with 8 mask bits per byte."""
    return torch.from_numpy(np.packbits(mask.detach().cpu().numpy().reshape(-1)))


def unpack_mask(packed: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Inverse of ``pack_mask``."""
    numel = int(np.prod(shape))
    return torch.from_numpy(np.unpackbits(packed.numpy(), count=numel).astype(bool).reshape(shape))


class EntryWriter:
    """Writes one entry while pruning runs (rank 0, under the writer lock); blocks are written in the background.
    Until :meth:`finish` writes the manifest the entry counts as absent."""

    def __init__(self, entry: Path) -> None:
        entry.mkdir(parents=True, exist_ok=True)
        (entry / MANIFEST_FILE).unlink(missing_ok=True)
        self.entry = entry
        self.files: dict[str, str] = {}
        self.weight_files: dict[str, str] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spp-cache-writer")
        self._pending: list[Future[None]] = []

    def add_weights(self, group: Mapping[str, torch.Tensor]) -> None:
        """Write ``group`` (qualified name -> weight) as the next ``weights-<k>.safetensors``, in the background."""
        name = f"weights-{len(self._pending):05d}.safetensors"
        tensors = {WEIGHT_PREFIX + n: w.detach().cpu().contiguous() for n, w in group.items()}
        self.weight_files.update({n: name for n in group})
        self._pending.append(self._pool.submit(self._write, name, tensors))

    def _write(self, name: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
        """Serialise ``tensors`` (safetensors) atomically to the entry's file ``name``; record its sha256."""
        data = save_bytes(tensors, metadata=metadata)
        _atomic_write_bytes(self.entry / name, data)
        self.files[name] = hashlib.sha256(data).hexdigest()

    def finish(self, masks: Mapping[str, torch.Tensor], key: dict[str, Any], record: dict[str, Any]) -> None:
        """Wait for the weights files, write the packed masks, then the manifest (``key``, the time, ``record``); on a
        failed write no manifest."""
        try:
            for future in self._pending:
                future.result()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        shapes = {n: list(masks[n].shape) for n in masks}
        self._write(STATE_FILE, {MASK_PREFIX + n: pack_mask(masks[n]) for n in masks}, {"shapes": json.dumps(shapes)})
        manifest = {"key": key, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **record,
                    "state_sha256": self.files[STATE_FILE], "files": self.files, "weight_files": self.weight_files,
                    "shapes": shapes}
        _atomic_write_bytes(self.entry / MANIFEST_FILE, json.dumps(manifest, indent=2, default=str).encode())

    def abort(self) -> None:
        """Stop the background writes and remove the unfinished entry."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        remove_entry(self.entry)


def read_manifest(entry: Path) -> dict[str, Any]:
    """Parse an entry's manifest (``CorruptEntryError`` when missing or unparsable)."""
    try:
        return json.loads((entry / MANIFEST_FILE).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CorruptEntryError(f"cache entry {entry} has no readable manifest: {err}") from err


class EntryReader:
    """A finished entry, opened for reading one matrix at a time (no lock: a finished entry never changes).
    A weights file is hashed and decoded when first read, one block at a time, so a 70B entry is never held whole."""

    def __init__(self, entry: Path) -> None:
        self.entry = entry
        self.manifest = read_manifest(entry)
        self.files: dict[str, str] = self.manifest.get("files") or {STATE_FILE: self.manifest.get("state_sha256")}
        for name in self.files:
            if not (entry / name).is_file():
                raise CorruptEntryError(f"cache entry {entry} has no {name}")
        if file_sha256(entry / STATE_FILE) != self.files[STATE_FILE]:
            raise CorruptEntryError(f"cache entry {entry}: {STATE_FILE} fails its sha256 checksum")
        try:
            self._state = safe_open(str(entry / STATE_FILE), framework="pt")
        except Exception as err:  # noqa: BLE001 - any decoding error means a corrupt file
            raise CorruptEntryError(f"cache entry {entry}: cannot decode {STATE_FILE}: {err}") from err
        self.weight_files: dict[str, str] = self.manifest.get("weight_files", {})
        self.shapes: dict[str, list[int]] = self.manifest.get("shapes", {})
        self._loaded: tuple[str, dict[str, torch.Tensor]] | None = None

    def _weights_file(self, name: str) -> dict[str, torch.Tensor]:
        """The tensors of weights file ``name``, read once, checked against its sha256 (the last one is kept)."""
        if self._loaded is None or self._loaded[0] != name:
            self._loaded = None
            data = (self.entry / name).read_bytes()
            if hashlib.sha256(data).hexdigest() != self.files.get(name):
                raise CorruptEntryError(f"cache entry {self.entry}: {name} fails its sha256 checksum")
            try:
                self._loaded = (name, load_bytes(data))
            except Exception as err:  # noqa: BLE001 - any decoding error means a corrupt file
                raise CorruptEntryError(f"cache entry {self.entry}: cannot decode {name}: {err}") from err
        return self._loaded[1]

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
            return self._weights_file(self.weight_files[name])[key]
        return None


def open_for_key(entry: Path, key: dict[str, Any]) -> EntryReader | None:
    """The reader of ``entry`` when it is finished (``None`` without a manifest); ``CorruptEntryError`` on a key or
    checksum mismatch."""
    if not (entry / MANIFEST_FILE).is_file():
        return None
    reader = EntryReader(entry)
    if reader.manifest.get("key") != key:
        raise CorruptEntryError(f"cache entry {entry} was written for other settings")
    return reader


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
