"""The writer's lock of a pruning cache entry: exclusive, with a timeout, and refused where ``flock`` does not work.
Node-local ``flock`` (Lustre ``localflock``) would let two nodes write one entry: :func:`check_locks_span_nodes`."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from spp.distributed import DistContext
from spp.errors import UserError
from spp.run_lock import HELD_ERRNOS, UNSUPPORTED_ERRNOS

log = logging.getLogger(__name__)

_probed: set[str] = set()
_spanned: set[str] = set()


def check_locks_work(path: Path) -> None:
    """Try an ``flock`` on ``path`` (once per directory and process); ``UserError`` when the filesystem refuses it.
    A lock held by another job also means locks work."""
    directory = path.parent
    if str(directory) in _probed:
        return
    directory.mkdir(parents=True, exist_ok=True)
    try:
        _try_lock(path, create=True)
    except OSError as err:
        if err.errno in UNSUPPORTED_ERRNOS:
            raise UserError(
                f"the filesystem of the pruning cache {directory} does not support file locks (flock: "
                f"{os.strerror(err.errno)}), so concurrent jobs could prune and write the same entry twice",
                "put cache_dir= on a filesystem with flock (a local disk, or Lustre/NFS mounted with flock; see "
                "docs/sweeps.md)", key="cache_dir") from err
        raise
    _probed.add(str(directory))


def _try_lock(path: Path, create: bool = False) -> bool | None:
    """Whether a non-blocking exclusive ``flock`` on ``path`` is granted (released at once); ``None`` when the
    file is not visible here (the cache is not shared with this node: nothing to collide with)."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o666)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in HELD_ERRNOS:
            return False
        raise
    finally:
        os.close(fd)  # closing releases a lock this process was granted
    return True


def check_locks_span_nodes(ctx: DistContext, directory: Path) -> None:
    """In a job spanning several nodes: check that a lock taken on rank 0's node excludes the other nodes.
    A lock granted on another node raises ``UserError`` on every rank; every rank calls it."""
    if not ctx.distributed or str(directory) in _spanned:
        return
    hosts = ctx.gather_objects(socket.gethostname(), long_wait=True)
    if len(set(hosts)) == 1:
        _spanned.add(str(directory))
        return
    probe, fd = directory / f".spp-lock-probe-{hosts[0]}-{os.getpid()}", None

    def hold() -> str:  # rank 0; an unwritable cache_dir reaches every rank at once
        nonlocal fd
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return str(probe)
    probe = Path(ctx.on_main(hold, OSError, long_wait=True))
    granted = _try_lock(probe) if hosts.index(hosts[ctx.rank]) == ctx.rank and ctx.rank != 0 else None
    results = ctx.gather_objects(granted, long_wait=True)
    if fd is not None:
        os.close(fd)
        probe.unlink(missing_ok=True)
    leaky = sorted({hosts[r] for r, g in enumerate(results) if g})
    if leaky:
        raise UserError(f"the pruning cache {directory} is on a filesystem whose file locks do not reach across "
                        f"nodes: a lock held on {hosts[0]} was also granted on {', '.join(leaky)} (Lustre mounted "
                        "with localflock?), so two jobs on different nodes could prune and write the same entry",
                        "point cache_dir= at a node-local disk (only global rank 0 reads and writes it) or at a "
                        "filesystem mounted with flock (docs/sweeps.md)", key="cache_dir")
    _spanned.add(str(directory))


@contextmanager
def entry_lock(entry: Path, timeout_s: float) -> Iterator[None]:
    """Hold the exclusive writer's lock ``<entry>.lock``, logging while waiting; ``UserError`` after ``timeout_s``."""
    check_locks_work(Path(f"{entry}.lock"))
    lock = FileLock(f"{entry}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("pruning cache: another job holds %s.lock (pruning the same key); waiting for it (at most %.0f s)",
                 entry, timeout_s)
        start = time.perf_counter()
        try:
            lock.acquire(timeout=timeout_s)
        except Timeout as err:
            raise UserError(f"another job held the pruning cache lock {entry}.lock for more than {timeout_s:g} s "
                            "(it is pruning the same model with the same settings)",
                            "wait for that job and run again (its entry will then be read), or raise "
                            "cache_lock_timeout_s=", key="cache_lock_timeout_s") from err
        log.info("pruning cache: lock acquired after %.1f s", time.perf_counter() - start)
    try:
        yield
    finally:
        lock.release()

