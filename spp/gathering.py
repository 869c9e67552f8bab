"""Reading whole parameters that a sharded strategy split over the ranks, one module at a time.

Each gatherer is a collective when sharded: every rank gathers the same modules in the same order."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from spp.adapters.base import ExternalParameters


class Gatherer:
    """Parameters held whole on every rank: nothing to gather (one process, DDP, ZeRO-2)."""

    @contextmanager
    def gathered(self, module: nn.Module) -> Iterator[None]:
        """Inside the block every parameter of ``module`` (children too) can be read whole through :meth:`full`."""
        yield

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """The whole value of ``t`` (a parameter of the gathered module, or a tensor computed from them)."""
        return t


class DTensorGatherer(Gatherer):
    """FSDP2: ``full_tensor()`` all-gathers a ``DTensor`` (plain tensors pass through); an FSDP2 unit is unsharded
    whole for the block and resharded after."""

    @contextmanager
    def gathered(self, module: nn.Module) -> Iterator[None]:
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(module, FSDPModule):
            yield
            return
        module.unshard()
        try:
            yield
        finally:
            module.reshard()

    def full(self, t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if isinstance(t, DTensor) else t


class ZeroGatherer(Gatherer):
    """DeepSpeed ZeRO-3: ``GatheredParameters`` over one module's parameters (read-only: nothing is written back)."""

    @contextmanager
    def gathered(self, module: nn.Module) -> Iterator[None]:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            yield


def gatherer_for(model: nn.Module) -> Gatherer:
    """The gatherer for how ``model``'s parameters are held now: ZeRO-3 partitions, FSDP2 ``DTensor`` s or whole."""
    params = list(model.parameters())
    if any(hasattr(p, "ds_id") for p in params):  # DeepSpeed gives each ZeRO-3 partitioned parameter a ``ds_id``
        return ZeroGatherer()
    if any(isinstance(p, DTensor) for p in params):
        return DTensorGatherer()
    return Gatherer()


def register_external_parameters(pairs: ExternalParameters, register: Any = None) -> int:
    """Register each ``(reader, parameter)`` with ZeRO-3 so that it is gathered around ``reader``'s forward and
    backward (``deepspeed.zero.register_external_parameter``, or ``register`` when given); returns how many."""
    if register is None:
        import deepspeed

        register = deepspeed.zero.register_external_parameter
    for reader, param in pairs:
        register(reader, param)
    return len(pairs)

