"""Atomic writes for every file the framework produces: a temporary sibling, then ``os.replace``."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spp.errors import UserError, exception_chain

log = logging.getLogger(__name__)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish(tmp: str | os.PathLike[str], path: str | os.PathLike[str], directory: bool = False) -> None:
    """Give a temporary file or folder the usual permissions (mkstemp makes 0600) and rename it to ``path``."""
    os.chmod(tmp, (0o777 if directory else 0o666) & ~_umask())
    os.replace(tmp, path)


def follow_umask(root: str | os.PathLike[str]) -> None:
    """Give every file under ``root`` mode ``0666 & ~umask`` and folder ``0777 & ~umask``: ``save_pretrained``
    writes owner-only temporaries, and on a shared cluster the user's umask decides who reads a result."""
    mask = _umask()
    for folder, dirs, files in os.walk(root):
        for name, mode in [*((d, 0o777) for d in dirs), *((f, 0o666) for f in files)]:
            if not os.path.islink(os.path.join(folder, name)):
                os.chmod(os.path.join(folder, name), mode & ~mask)


def write_file_atomic(path: str | os.PathLike[str], writer: Callable[[Path], Any]) -> Path:
    """Let ``writer(tmp_path)`` write a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        writer(Path(tmp))
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically and return the path."""
    return write_file_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as indented JSON atomically (non-JSON values via ``str``)."""
    return write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_dir_atomic(path: str | os.PathLike[str], writer: Callable[[Path], Any]) -> Path:
    """Fill a temporary folder beside ``path`` with ``writer(tmp_dir)`` and move it into place (umask permissions).

    An existing ``path`` is moved aside first and deleted once the new one is in place (put back on failure)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    old: Path | None = None
    try:
        writer(tmp)
        follow_umask(tmp)
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.old."))
            os.replace(path, old / path.name)
        publish(tmp, path, directory=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists() and (old / path.name).exists():
            os.replace(old / path.name, path)  # the previous folder goes back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return path


def check_writable_dir(path: str | os.PathLike[str], key: str, fix: str | None = None,
                       value: str | os.PathLike[str] | None = None) -> Path:
    """Create ``path`` and prove it writable by a real write (root ignores permission bits), before any model loads;
    the error names ``key`` (``value``: its value when ``path`` is inside it)."""
    path = Path(path).expanduser()
    where = f"{key}={str(value if value is not None else path)!r}" + (f": {path}" if value is not None else "")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".spp-write-probe.", suffix=".tmp")
        os.close(fd)
        Path(probe).unlink(missing_ok=True)  # a rank racing the leader's clean-up may find it gone
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise UserError(f"{where} is not a writable directory ({reason})",
                        fix or f"point {key}= at a directory you can write to, or make it writable",
                        key=key, path=path) from err
    return path


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) says the disk or the user's quota is full: ``ENOSPC`` /
    ``EDQUOT``, also as safetensors' writer words it (``SafetensorError: ... StorageFull ... No space left``)."""
    return any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
               or any(text in str(e) for text in ("No space left on device", "Disk quota exceeded", "StorageFull"))
               for e in exception_chain(err))


def human_bytes(n: float) -> str:
    """``1.2 GiB``, ``512.0 KiB``, ``12 B``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


STALE_DIRS = (".merged.", ".adapter.", ".model.")
"""Prefixes of the temporary folders :func:`spp.atomic.write_dir_atomic` makes for the run's exports."""


def remove_stale_temporaries(run_dir: str | os.PathLike[str] | None, cache_dirs: list[str | os.PathLike[str]] = (),
                             min_age_s: float = 600.0) -> list[str]:
    """Remove what killed runs left: ``.merged.*`` / ``.adapter.*`` / ``.model.*`` folders and ``.*.tmp`` files in
    ``run_dir``; cache ``*.tmp`` files untouched for ``min_age_s`` (a live writer keeps its file fresh)."""
    removed: list[str] = []
    if run_dir is not None and Path(run_dir).is_dir():
        for path in Path(run_dir).iterdir():
            if path.is_dir() and path.name.startswith(STALE_DIRS):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
            elif path.is_file() and path.name.startswith(".") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                removed.append(str(path))
    for cache in cache_dirs:
        root = Path(cache).expanduser()
        if not root.is_dir():
            continue
        for path in root.rglob("*.tmp"):
            try:
                if path.is_file() and time.time() - path.stat().st_mtime > min_age_s:
                    path.unlink()
                    removed.append(str(path))
            except OSError:
                continue
    for path in removed:
        log.warning("removed a temporary left by a killed run: %s", path)
    return removed
