"""On-disk pruning cache entries: packed masks (+ SparseGPT weights) in safetensors and a manifest with a checksum.

An entry is a directory ``<cache_dir>/pruning/<model identity>/<pruner>-<pattern>-<key hash>/`` holding
``state.safetensors`` and ``manifest.json``. Both are written to a temporary file then renamed; the manifest is
written last and records the state file's sha256, so a partial or corrupted entry is detected on read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

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


def write_entry(
    entry: Path,
    masks: dict[str, torch.Tensor],
    weights: dict[str, torch.Tensor] | None,
    manifest: dict[str, Any],
) -> None:
    """Write an entry atomically: state file (temp + rename), then the manifest with its checksum."""
    entry.mkdir(parents=True, exist_ok=True)
    (entry / MANIFEST_FILE).unlink(missing_ok=True)
    tensors = {MASK_PREFIX + n: pack_mask(m) for n, m in masks.items()}
    for n, w in (weights or {}).items():
        tensors[WEIGHT_PREFIX + n] = w.detach().cpu().contiguous()
    shapes = {n: list(m.shape) for n, m in masks.items()}
    fd, tmp = tempfile.mkstemp(dir=entry, prefix=f".{STATE_FILE}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"shapes": json.dumps(shapes)})
        publish(tmp, entry / STATE_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    manifest = {**manifest, "state_sha256": sha256_file(entry / STATE_FILE), "shapes": shapes}
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


def read_entry(entry: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Verify the checksum and return (manifest, masks, weights).

    Raises:
        CorruptEntryError: missing files or a checksum mismatch.
    """
    manifest = read_manifest(entry)
    state = entry / STATE_FILE
    if not state.is_file():
        raise CorruptEntryError(f"cache entry {entry} has no {STATE_FILE}")
    if sha256_file(state) != manifest.get("state_sha256"):
        raise CorruptEntryError(f"cache entry {entry}: {STATE_FILE} fails its sha256 checksum")
    try:
        tensors = load_file(str(state))
    except Exception as err:  # noqa: BLE001 - any decoding error means a corrupt file
        raise CorruptEntryError(f"cache entry {entry}: cannot decode {STATE_FILE}: {err}") from err
    shapes = manifest["shapes"]
    masks = {n: unpack_mask(tensors[MASK_PREFIX + n], s) for n, s in shapes.items()}
    weights = {k[len(WEIGHT_PREFIX) :]: v for k, v in tensors.items() if k.startswith(WEIGHT_PREFIX)}
    return manifest, masks, weights


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
