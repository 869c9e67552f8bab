"""The dense teacher of an objective that has one (``objective=distill``), placed on every rank as the student is:
FSDP2 shards over the student's mesh, else a replica on this rank's device outside the module tree.
"""

from __future__ import annotations

import logging

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from spp.distributed import DistContext
from spp.training.strategies import broadcast_state, replicate_from_rank0, shard_from_rank0, shard_model

log = logging.getLogger(__name__)


def place_teacher(teacher: nn.Module, ctx: DistContext, from_rank0: bool, mesh: DeviceMesh | None = None,
                  layer_cls: type[nn.Module] | None = None) -> None:
    """Give this rank its part of ``teacher`` (module docstring): FSDP2 shards when ``mesh`` is given, else a
    replica on ``ctx.device``; ``from_rank0``: only rank 0 holds the weights (a collective: every rank calls it)."""
    if mesh is not None:
        if from_rank0:
            shard_from_rank0(teacher, mesh, layer_cls, ctx, reshard_after_forward=True)
        else:
            shard_model(teacher, mesh, layer_cls, reshard_after_forward=True)
    else:
        if from_rank0:
            replicate_from_rank0(teacher, ctx)  # the other ranks allocate their replica on their device
        teacher.to(ctx.device)
        if from_rank0:
            broadcast_state(teacher, ctx)
    if ctx.is_main:
        n = sum(p.numel() for p in teacher.parameters())
        how = f"FSDP2 shards over {ctx.world} ranks" if mesh is not None else f"a replica on {ctx.device} per rank"
        log.info("fit phase: dense teacher (%s parameters, frozen) placed as %s", f"{n:,}", how)


def match_dtype(teacher: nn.Module, student: nn.Module) -> None:
    """Cast ``teacher`` to the dtype of the student's frozen floating-point weights when they differ (a strategy
    or precision plugin cast the student after ``configure_model``)."""
    dtype = next((p.dtype for p in student.parameters() if not p.requires_grad and p.is_floating_point()), None)
    if dtype is not None and any(p.dtype != dtype for p in teacher.parameters() if p.is_floating_point()):
        teacher.to(dtype)
