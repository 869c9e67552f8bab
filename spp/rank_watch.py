"""Which rank stopped a distributed job, in one line, from per-rank heartbeats in the job's store.

gloo and NCCL name no rank; on a failed collective :func:`rank_failure` names ranks dead, stopped or stuck."""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from spp.errors import RankFailureError, UserError, exception_chain, register_error_translator

HEARTBEAT_S = 1.0
"""How often each rank bumps its beat."""

GRACE_S = 4.0
"""How long a failing rank watches the others' beats before it judges (a dead rank's beat stops within it)."""

_PREFIX = "spp/rank_watch/"
_SPP_DIR = str(Path(__file__).resolve().parent)

_PHASES = (("spp/training/callbacks/pruning", "prune"), ("spp/pruning/", "prune"), ("spp/models/loading", "load"),
           ("spp/export/", "export"), ("spp/eval/", "evaluate"), ("spp/training/finalize", "adapter files"),
           ("spp/training/", "train"))
"""Where an ``spp`` frame's file is → the job phase it belongs to (first match wins; else ``job``)."""

_PLUMBING = ("spp/distributed.py", "spp/rank_watch.py", "spp/errors.py")
"""The collective helpers: never the place to name (the caller is)."""

_LIBRARY_PHASES = (("lightning/pytorch/loops", "train"),)
"""The same for a library's frames (a collective inside Lightning's training loop)."""

_COMMS = re.compile(r"gloo|nccl|connection (reset|closed|refused)|timed out waiting|timeout caused pair closure|"
                    r"broken pipe|socket timeout|DistBackendError|DistNetworkError", re.IGNORECASE)
_DIST_ERRORS = {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}
_TIMEOUT = re.compile(r"timed out waiting (\d+) ?ms|timeout caused pair closure|socket timeout", re.IGNORECASE)


class _Watch:
    """This process's heartbeat thread and what it needs to judge the others."""

    def __init__(self, store: Any, rank: int, world: int, generation: int) -> None:
        self.store, self.rank, self.world = store, rank, world
        self.prefix = f"{_PREFIX}{generation}/"
        self.stop_event = threading.Event()
        self.lost = False  # the store is unreachable (its host died): touched no more, so C++ warns only once
        self.main = threading.main_thread().ident
        self.thread = threading.Thread(target=self._beat, name="spp-rank-watch", daemon=True)

    def _beat(self) -> None:
        count = 0
        while not self.stop_event.is_set() and not self.lost:
            count += 1
            self.mark("beat", f"{count} {self.where()}")
            self.stop_event.wait(HEARTBEAT_S)

    def where(self) -> str:
        """The innermost frame of the main thread inside ``spp`` (else the innermost): ``file.py:line func``."""
        frame = sys._current_frames().get(self.main)
        inner = frame
        while frame is not None:
            path = _spp_path(frame.f_code.co_filename)
            if path is not None and path not in _PLUMBING:
                return f"{path}:{frame.f_lineno} {frame.f_code.co_name}"
            frame = frame.f_back
        return f"{Path(inner.f_code.co_filename).name}:{inner.f_lineno} {inner.f_code.co_name}" if inner else "?"

    def mark(self, what: str, text: str) -> None:
        """Record ``<what>/<rank>`` (``beat``, ``exit``, ``failed``) for the other ranks; ignore a lost store."""
        if self.lost:
            return
        try:
            self.store.set(f"{self.prefix}{what}/{self.rank}", text)
        except Exception:  # noqa: BLE001 - the store's host is gone: the failing collective will say so
            self.lost = True

    def read(self, what: str, rank: int) -> str | None:
        """Rank ``rank``'s ``what`` record, or ``None`` when it has none (never blocks on a missing key)."""
        if self.lost:
            raise ConnectionError("the job's store is gone")
        key = f"{self.prefix}{what}/{rank}"
        return self.store.get(key).decode() if self.store.check([key]) else None


_watch: _Watch | None = None
_generation = 0


def _spp_path(filename: str) -> str | None:
    """``spp/pruning/cache/__init__.py`` for a file of this package, else ``None``."""
    path = Path(filename)
    return f"spp/{path.relative_to(_SPP_DIR).as_posix()}" if path.is_relative_to(_SPP_DIR) else None


def start_for_process_group() -> None:
    """Start this process's heartbeat in the initialised default process group's store (once per group; every rank
    of a job with more than one process; nothing without a group)."""
    import torch.distributed as dist

    global _watch, _generation
    try:
        store = dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):  # no default group, or a torch without this helper
        return
    if dist.get_world_size() < 2 or (_watch is not None and _watch.store is store):
        return
    stop()  # a new process group (its own store): the old heartbeat ends
    _generation += 1
    _watch = _Watch(store, dist.get_rank(), dist.get_world_size(), _generation)
    _watch.thread.start()
    if _generation == 1:
        atexit.register(stop, "left through Python (see its own error line)")


def stop(how: str = "finished") -> None:
    """The job's collectives are over (before the process group closes; or Python exits, ``how`` it left): say so
    and stop beating."""
    global _watch
    if _watch is not None:
        _watch.mark("exit", how)
        _watch.stop_event.set()
        _watch = None


def is_comms_error(exc: BaseException) -> bool:
    """A collective's failure (gloo/NCCL/the store), anywhere in ``exc``'s cause or context chain."""
    return any(type(e).__name__ in _DIST_ERRORS or (isinstance(e, RuntimeError) and _COMMS.search(str(e)))
               for e in exception_chain(exc))


def phase_of(tb: TracebackType | None) -> tuple[str, str]:
    """The job phase and where this rank was, from a collective's traceback: ``("prune", "spp/models/offload.py:76
    load (broadcast)")`` — the innermost ``spp`` frame outside the collective helpers, and the collective."""
    frames = [(frame.f_code.co_filename, line, frame.f_code.co_name) for frame, line in traceback.walk_tb(tb)]
    ours = [(path, line, func) for path, line, func in ((_spp_path(n), ln, f) for n, ln, f in frames) if path]
    ours = [f for f in ours if f[0] not in _PLUMBING] or ours
    calls = [func for name, _, func in frames if "torch/distributed/" in Path(name).as_posix()
             and not func.startswith("_") and func != "wrapper"]
    where = f"{ours[-1][0]}:{ours[-1][1]} {ours[-1][2]}" if ours else "?"
    where += f" ({calls[-1]})" if calls else ""
    for name, _, _ in reversed(ours):
        phase = next((phase for part, phase in _PHASES if name.startswith(part)), None)
        if phase is not None:
            return phase, where
    library = [phase for name, _, _ in reversed(frames) for part, phase in _LIBRARY_PHASES
               if part in Path(name).as_posix()]
    return (library[0] if library else "job"), where


def _short(exc: BaseException) -> str:
    """The collective's own message, without gloo's source location and advice."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|hpp|h):\d+\] ", "", text)
    return text.split(". This is typically")[0][:200]


def _timeout_s(exc: BaseException) -> float | None:
    """The timeout that expired (seconds; ``0.0`` when unknown), or ``None`` when the collective did not time out."""
    match = _TIMEOUT.search(str(exc))
    if match is None:
        return None
    return int(match.group(1)) / 1000 if match.group(1) else 0.0


def _judge(watch: _Watch, timed_out: bool) -> tuple[list[int], list[int], list[tuple[int, str]]]:
    """The other ranks that are dead, that stopped on their own error, and that are stuck (alive, elsewhere)."""
    others = [r for r in range(watch.world) if r != watch.rank]
    time.sleep(1.5 * HEARTBEAT_S)  # a store whose host died is noticed by the heartbeat first
    before = {r: watch.read("beat", r) for r in others}
    time.sleep(GRACE_S)
    dead, stopped, stuck = [], [], []
    for r in others:
        beat = watch.read("beat", r)
        if watch.read("failed", r) is not None:
            continue  # a survivor, like this rank
        if watch.read("exit", r) is not None:
            stopped.append(r)
        elif beat is None or beat == before[r]:
            dead.append(r)
        elif timed_out:
            stuck.append((r, beat.partition(" ")[2]))
    return dead, stopped, stuck


def _names(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def rank_failure(exc: BaseException) -> UserError | None:
    """A collective's failure as one line naming the rank that caused it and the phase; ``None`` for another error.

    This rank marks itself failed first, so the others do not blame it."""
    if not is_comms_error(exc) or (_watch is None and int(os.environ.get("WORLD_SIZE", "1") or 1) < 2):
        return None
    phase, where = phase_of(exc.__traceback__)
    watch, timeout = _watch, _timeout_s(exc)
    if watch is not None:
        watch.mark("failed", f"{phase} at {where}")
    me = f"rank {watch.rank} of {watch.world}" if watch is not None else "this rank"
    noticed = f"{me} noticed in {where} ({_short(exc)})"
    try:
        dead, stopped, stuck = _judge(watch, timeout is not None) if watch is not None else ([], [], [])
    except Exception:  # noqa: BLE001 - the store is unreachable: its host is gone
        return RankFailureError(f"the job's store is gone during the {phase} phase: {_store_host()} stopped; "
                                f"{noticed}", "read that process's log for why it stopped (killed, out of memory, "
                                "a crash), then rerun", key="strategy.timeout_s")
    if dead:
        return RankFailureError(f"{_names(dead)} died during the {phase} phase (no heartbeat and no exit through "
                                f"Python: killed, out of memory or crashed); {noticed}",
                                f"read {_names(dead)}'s log (and the scheduler's / dmesg) for why, then rerun; "
                                "train.py resumes with trainer.resume_from=last", key="strategy.timeout_s")
    if stuck:
        places = "; ".join(f"rank {r} is at {place}" for r, place in stuck)
        return RankFailureError(f"{_names([r for r, _ in stuck])} did not reach the collective within "
                                f"{timeout or 0:g} s during the {phase} phase ({places}); {noticed}",
                                "if that work may take longer, raise strategy.timeout_s (cache_lock_timeout_s for "
                                "the pruning cache's waits), else find why it is stuck (py-spy dump --pid <pid>)",
                                key="strategy.timeout_s")
    if stopped:
        return RankFailureError(f"{_names(stopped)} stopped on its own error during the {phase} phase; {noticed}",
                                f"see {_names(stopped)}'s own error line", key="strategy.timeout_s")
    return RankFailureError(f"a collective failed during the {phase} phase; {noticed}",
                            "read every rank's log; across nodes check the network interfaces (GLOO_SOCKET_IFNAME, "
                            "NCCL_SOCKET_IFNAME: docs/multinode.md) and strategy.timeout_s", key="strategy.timeout_s")


def _store_host() -> str:
    """Who held the job's store: torchrun's agent, or global rank 0 (``srun``, Lightning's launcher)."""
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return f"the torchrun agent holding it at {address}"
    return f"global rank 0, which held it at {address},"


register_error_translator(rank_failure)
