"""The processes of one job: who this process is, which device it owns, and the few collectives pruning uses.
Task *k* of a node gets ``cuda:k`` whether ``LOCAL_RANK`` or only ``SLURM_LOCALID`` is set (Lightning's order)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

from spp import rank_watch

T = TypeVar("T")


def local_world_size(world: int) -> int:
    """Processes per node: ``LOCAL_WORLD_SIZE`` (torchrun), else ``SLURM_NTASKS_PER_NODE`` (srun), else ``world``."""
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(key, "").split("(")[0].split(",")[0]  # Slurm may write "8(x2)"
        if value.isdigit() and int(value) > 0:
            return int(value)
    return world


def cluster_environment() -> ClusterEnvironment:
    """The environment Lightning would detect for this process (torchrun first: it may run inside Slurm)."""
    for env_type in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment):
        try:
            if env_type.detect():
                return env_type()
        except (ImportError, RuntimeError):  # MPI without mpi4py; srun misuse is Lightning's error at fit time
            continue
    return LightningEnvironment()


def local_device(accelerator: str = "auto") -> torch.device:
    """This process's device: ``cuda:<local rank>`` when the job uses GPUs and one is visible, else the CPU."""
    if accelerator != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", cluster_environment().local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


_WAIT_GROUP: tuple[Any, float, Any] | None = None
"""This process's wait group: ``(the default group it belongs to, its timeout, the group)``
(:meth:`DistContext.allow_long_waits`); every context of that default group uses it."""


def _shared_wait_group() -> tuple[float | None, Any]:
    """The timeout and group of the wait group made for the current default process group (``(None, None)``)."""
    if _WAIT_GROUP is None or _WAIT_GROUP[0] is not dist.group.WORLD:
        return None, None
    return _WAIT_GROUP[1], _WAIT_GROUP[2]


@dataclass
class DistContext:
    """Rank, world size and device of this process, with sum/broadcast collectives that vanish when alone."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @classmethod
    def current(cls, device: torch.device | str | None = None) -> DistContext:
        """The context of the initialised process group (or a single process) on ``device``; with a group, this
        process's heartbeat starts (:mod:`spp.rank_watch`)."""
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dist.is_available() and dist.is_initialized():
            rank_watch.start_for_process_group()
            return cls(dist.get_rank(), dist.get_world_size(), dev)
        return cls(0, 1, dev)

    @property
    def distributed(self) -> bool:
        """More than one process takes part."""
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Global rank 0: holds the weights, reads and writes the caches."""
        return self.rank == 0

    def owner(self, index: int) -> int:
        """The rank that owns item ``index`` of a round-robin split (matrices to solve, batches to run)."""
        return index % self.world

    def mine(self, count: int) -> list[int]:
        """The indices ``0..count-1`` this rank takes in a round-robin split."""
        return list(range(self.rank, count, self.world))

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``tensor`` on every rank with ``src``'s (in place; returns it)."""
        if self.distributed:
            dist.broadcast(tensor, src=src)
        return tensor

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place on every rank."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def reduce_(self, tensor: torch.Tensor, dst: int) -> torch.Tensor:
        """Sum ``tensor`` over the ranks onto ``dst`` (other ranks' copies are left undefined)."""
        if self.distributed:
            dist.reduce(tensor, dst=dst, op=dist.ReduceOp.SUM)
        return tensor

    def allow_long_waits(self, timeout_s: float) -> None:
        """Make the gloo *wait group* with timeout ``timeout_s`` for ``long_wait=True`` collectives (rank 0 working
        alone). Every rank calls it at the same point: creating a group is itself a collective."""
        global _WAIT_GROUP
        wait_s, _ = _shared_wait_group()
        if not self.distributed or (wait_s is not None and wait_s >= timeout_s):
            return
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(1, int(timeout_s))))
        _WAIT_GROUP = (dist.group.WORLD, float(timeout_s), group)

    def _group(self, long_wait: bool) -> Any:
        return _shared_wait_group()[1] if long_wait else None

    def broadcast_object(self, obj: Any, src: int = 0, long_wait: bool = False) -> Any:
        """``src``'s picklable object on every rank (through the wait group with ``long_wait``)."""
        if not self.distributed:
            return obj
        box = [obj if self.rank == src else None]
        group = self._group(long_wait)  # the gloo wait group sends objects through the CPU
        device = self.device if group is None and self.device.type == "cuda" else None
        dist.broadcast_object_list(box, src=src, group=group, device=device)
        return box[0]

    def gather_objects(self, obj: Any, long_wait: bool = False) -> list[Any]:
        """Every rank's object, in rank order, on every rank (through the wait group with ``long_wait``)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self._group(long_wait))
        return out

    def on_main(self, work: Callable[[], T], errors: type[Exception] | tuple[type[Exception], ...] = (),
                meanwhile: Callable[[], object] | None = None, long_wait: bool = False) -> T:
        """``work()`` on global rank 0 (``meanwhile()`` on the others, for the collectives ``work`` makes); its result,
        or the ``errors`` it raised, reaches every rank (raised there too; through the wait group with ``long_wait``).
        """
        outcome: Any = None
        if self.is_main:
            try:
                outcome = work()
            except errors as err:
                outcome = err
        elif meanwhile is not None:
            meanwhile()
        outcome = self.broadcast_object(outcome, long_wait=long_wait)
        if isinstance(outcome, errors):
            raise outcome
        return outcome


def close_process_group() -> None:
    """Destroy the job's process group, if any (after the last collective of the job; the heartbeats stop)."""
    global _WAIT_GROUP
    rank_watch.stop()
    _WAIT_GROUP = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def launch_processes(accelerator: str = "auto", devices: int = 1, num_nodes: int = 1,
                     device: str | None = None) -> DistContext:
    """Start (or join, under ``torchrun`` / ``srun``) the processes with Lightning Fabric (this one's context)."""
    from lightning.fabric import Fabric

    env = cluster_environment()
    if env.creates_processes_externally and env.world_size() > 1 and env.world_size() != devices * num_nodes:
        local = local_world_size(env.world_size())
        logging.getLogger(__name__).info("%s started %d processes (%d per node): running on all of them (devices=%d "
                                         "num_nodes=%d were given)", type(env).__name__, env.world_size(), local,
                                         devices, num_nodes)
        devices, num_nodes = local, env.world_size() // local
    world = devices * num_nodes
    fabric = Fabric(accelerator=accelerator if device is None else ("cpu" if device == "cpu" else "gpu"),
                    devices=devices, num_nodes=num_nodes, strategy="ddp" if world > 1 else "auto")
    fabric.launch()
    return DistContext.current(device if device is not None and world == 1 else fabric.device)
