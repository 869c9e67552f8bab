"""One job per run directory: an exclusive, non-blocking ``flock`` on ``<run_dir>/.spp-run.lock`` for the whole job.

Only the leader (global rank 0) takes it; the kernel releases it however the process ends (no stale lock)."""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spp.atomic import check_writable_dir
from spp.errors import UserError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock (the project runs on Linux)
    fcntl = None  # type: ignore[assignment]

UNSUPPORTED_ERRNOS = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}
"""``flock`` errors that mean the filesystem does not support locks (not that the lock is held)."""
HELD_ERRNOS = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES}
"""``flock`` errors that mean another process holds the lock."""
LOCK_FILE = ".spp-run.lock"
"""The lock's file name inside the run directory (it stays there; only a held ``flock`` on it counts)."""

_RANK_KEYS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Where a launcher puts a process's rank (the order Lightning's ``rank_zero_only`` reads them in)."""


def is_job_leader() -> bool:
    """Whether this process speaks for its job: global rank 0 on node 0 (also a plain single-process run)."""
    rank = next((os.environ[key] for key in _RANK_KEYS if os.environ.get(key)), "0")
    node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
    return int(rank) == 0 and int(node) == 0


def _holder(fd: int) -> str:
    """``pid 123 on host h since <time>`` from the lock file (written by the holder), or a generic phrase."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on host {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _claim(fd: int) -> None:
    """Record this process as the holder (pid, host, start time) in the lock file."""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    except OSError:  # opened read-only (see hold_run_dir): the lock holds, only its holder goes unrecorded
        pass


@contextmanager
def hold_run_dir(run_dir: str | os.PathLike[str], key: str = "run_dir") -> Iterator[Path]:
    """Create ``run_dir`` (writable) and, in the job's leader (:func:`is_job_leader`), hold its lock until the block
    ends (``UserError`` naming the holder's pid and host when held)."""
    run_dir = check_writable_dir(run_dir, key)
    if not is_job_leader() or fcntl is None:
        yield run_dir
        return
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file in a shared run directory: a read-only flock works too
        fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in UNSUPPORTED_ERRNOS:
                raise UserError(f"the filesystem of {key}={str(run_dir)!r} does not support file locks (flock: "
                                f"{os.strerror(err.errno)}), so two jobs could write into it at once",
                                f"give {key}= a directory on a filesystem with flock (a local disk, or Lustre/NFS "
                                "mounted with flock)", key=key, path=run_dir) from None
            if err.errno not in HELD_ERRNOS:
                raise
            raise UserError(f"{key}={str(run_dir)!r} is in use by another job ({_holder(fd)}; lock {path}); two "
                            "jobs in one run directory would mix their outputs",
                            f"wait for that job to end, or give this job another {key}=", key=key,
                            path=run_dir) from None
        _claim(fd)
        yield run_dir
    finally:
        os.close(fd)  # releases the flock
