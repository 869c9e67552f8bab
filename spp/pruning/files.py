"""Atomic file writes (temporary file in the same directory, then ``os.replace``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish(tmp: str | Path, path: str | Path, directory: bool = False) -> None:
    """Give a temporary file or directory the usual permissions (mkstemp makes 0600) and rename it to ``path``."""
    os.chmod(tmp, (0o777 if directory else 0o666) & ~_umask())
    os.replace(tmp, path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON atomically."""
    return write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_dir_atomic(path: str | Path, writer: Callable[[Path], None]) -> Path:
    """Let ``writer`` fill a temporary sibling directory, then rename it to ``path`` (replacing an old one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        writer(tmp)
        if path.exists():
            shutil.rmtree(path)
        publish(tmp, path, directory=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
