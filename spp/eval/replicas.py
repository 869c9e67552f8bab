"""Evaluation spread over *replicas*: processes that each hold a whole model and share the evaluation's work.

A replica is ``gpus_per_replica`` consecutive local ranks; its leader loads the model and evaluates, the others wait.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from spp.distributed import DistContext, cluster_environment, local_world_size
from spp.errors import UserError
from spp.eval.perplexity import PerplexityResult, eval_windows, result_from_sums, score_windows

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 6 * 3600
"""How long a replica (or a waiting non-leader) may wait for the others: a whole evaluation at 70B."""


@dataclass(frozen=True)
class ReplicaLayout:
    """Which replica this process belongs to (global rank = ``node * local_world + local_rank``, as torchrun and srun
    number them); ``gpus_per_replica`` must divide the processes per node."""

    rank: int = 0
    world: int = 1
    local_world: int = 1
    gpus_per_replica: int = 1

    def __post_init__(self) -> None:
        k, per_node = self.gpus_per_replica, self.local_world
        if k < 1:
            raise UserError(f"eval.gpus_per_replica={k} must be >= 1", "set eval.gpus_per_replica=1 or more",
                            key="eval.gpus_per_replica")
        if per_node < 1 or self.world % per_node:
            raise UserError(f"{self.world} processes cannot be split into nodes of {per_node} (LOCAL_WORLD_SIZE)",
                            "start the same number of processes on every node")
        if per_node % k:
            raise UserError(f"eval.gpus_per_replica={k} does not divide the {per_node} processes (GPUs) of a node",
                            f"use a divisor of {per_node}", key="eval.gpus_per_replica")

    @property
    def local_rank(self) -> int:
        """Rank within the node."""
        return self.rank % self.local_world

    @property
    def count(self) -> int:
        """Number of replicas ``R``."""
        return self.world // self.gpus_per_replica

    @property
    def index(self) -> int:
        """This process's replica (0 .. R-1)."""
        return self.rank // self.gpus_per_replica

    @property
    def leader(self) -> int:
        """Global rank of this replica's leader (the process that holds the model)."""
        return self.rank - self.local_rank % self.gpus_per_replica

    @property
    def is_leader(self) -> bool:
        """Whether this process holds a replica's model and evaluates."""
        return self.rank == self.leader

    @property
    def leaders(self) -> list[int]:
        """Global ranks of every replica's leader, in replica order."""
        return list(range(0, self.world, self.gpus_per_replica))

    @property
    def local_gpus(self) -> list[int]:
        """Local GPU indices of this replica: the GPUs of its processes (``cuda:<local rank>`` each)."""
        first = self.leader % self.local_world
        return list(range(first, first + self.gpus_per_replica))

    def placement(self, lm_eval_model_args: dict[str, Any] | None = None) -> dict[str, Any]:
        """How an evaluation was spread (``summary.json``): ``replicas`` R, ``gpus_per_replica`` k, ``how``
        (``single``, ``data_parallel``, ``parallelize`` or both), ``world`` and lm-eval's equivalent
        ``--model_args``."""
        modes = [m for m, on in (("data_parallel", self.count > 1), ("parallelize", self.gpus_per_replica > 1)) if on]
        return {"replicas": self.count, "gpus_per_replica": self.gpus_per_replica, "how": "+".join(modes) or "single",
                "world": self.world, "lm_eval_model_args": dict(lm_eval_model_args or {})}


def replica_devices(layout: ReplicaLayout, device_count: int | None = None,
                    device: torch.device | None = None) -> list[int]:
    """CUDA device indices of this replica's ``device_map`` (``[]`` without CUDA); a one-GPU replica takes the
    process's own GPU (alone, the one ``device`` names: ``eval.device=cuda:1``). Fewer visible GPUs than the replica
    spans (srun ``--gpus-per-task=1``) raise ``UserError``."""
    count = torch.cuda.device_count() if device_count is None else device_count
    if count == 0:
        return []
    if layout.gpus_per_replica == 1:
        alone = layout.world == 1 and device is not None and device.index is not None
        return [device.index if alone else layout.local_rank % count]
    gpus = layout.local_gpus
    if gpus[-1] >= count:
        raise UserError(f"eval.gpus_per_replica={layout.gpus_per_replica} needs GPUs {gpus} on the node, but this "
                        f"process sees {count}", "make every GPU of the node visible to every task, or lower "
                        "eval.gpus_per_replica", key="eval.gpus_per_replica")
    return gpus


def max_memory_map(devices: list[int], per_gpu: int | str | None) -> dict[int, int | str]:
    """accelerate's ``max_memory`` restricted to ``devices`` (``None`` = accelerate's own estimate per device)."""
    if per_gpu is None:
        from accelerate.utils import get_max_memory

        return {d: v for d, v in get_max_memory().items() if d in devices}
    return dict.fromkeys(devices, per_gpu)


@dataclass(frozen=True)
class ReplicaGroup(ReplicaLayout):
    """The replicas of a job and the gloo process group over their leaders (``None`` with one replica).

    Creating it is a collective over all ranks; the other collectives are for leaders only, except :meth:`share`."""

    ctx: DistContext = field(default_factory=DistContext)
    group: Any = None

    @classmethod
    def create(cls, ctx: DistContext, gpus_per_replica: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S) -> ReplicaGroup:
        """The replicas of ``ctx``; every rank calls it."""
        per_node = 1 if ctx.world == 1 else local_world_size(ctx.world)
        layout = ReplicaLayout(ctx.rank, ctx.world, per_node, gpus_per_replica)
        if ctx.distributed and layout.local_rank != cluster_environment().local_rank():
            raise UserError(f"rank {ctx.rank} has local rank {cluster_environment().local_rank()}, not "
                            f"{layout.local_rank}: ranks are not numbered node by node ({per_node} per node)",
                            "start the job with torchrun or srun (consecutive ranks per node)")
        group = None
        if ctx.distributed:
            ctx.allow_long_waits(timeout_s)
            if layout.count > 1:
                group = dist.new_group(ranks=layout.leaders, backend="gloo",
                                       timeout=timedelta(seconds=max(1, int(timeout_s))))
        return cls(ctx.rank, ctx.world, per_node, gpus_per_replica, ctx, group)

    def mine(self, count: int) -> list[int]:
        """Items ``0..count-1`` this replica takes in a round-robin split (``b % R == index``)."""
        return list(range(self.index, count, self.count))

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the replicas, in place (through the CPU: the group is gloo)."""
        if self.group is not None:
            host = tensor.detach().cpu()
            dist.all_reduce(host, op=dist.ReduceOp.SUM, group=self.group)
            tensor.copy_(host)
        return tensor

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Replica ``src``'s object on every replica (leaders only)."""
        if self.group is None:
            return obj
        box = [obj if self.index == src else None]
        dist.broadcast_object_list(box, group=self.group, group_src=src)
        return box[0]

    def share(self, obj: Any) -> Any:
        """Global rank 0's (replica 0's leader's) object on every process, waiting up to the group's timeout: the
        end of an evaluation, where the non-leaders have waited."""
        return self.ctx.broadcast_object(obj, src=0, long_wait=True)


def replica_perplexity(model: torch.nn.Module, tokenizer: Any, replicas: ReplicaGroup, source: str = "wikitext2",
                       seqlen: int = 2048, max_windows: int | None = None, batch_size: int = 1,
                       data_dir: str | os.PathLike[str] | None = None, sampling: str = "first") -> PerplexityResult:
    """:func:`spp.eval.perplexity.perplexity` with batch ``b`` scored by replica ``b % R`` and the per-window NLL sums
    added in float64 (the same numbers); every leader calls it and gets the result."""
    if not replicas.is_leader:
        raise RuntimeError("replica_perplexity runs on replica leaders only (the others hold no model)")
    windows = eval_windows(tokenizer, source, seqlen, max_windows, batch_size, data_dir, sampling, model)
    mine = replicas.mine(len(windows.batches(batch_size)))
    sums = score_windows(model, windows, batch_size, mine, next(model.parameters()).device, quiet=replicas.index != 0)
    return result_from_sums(replicas.all_reduce_(sums), windows)
