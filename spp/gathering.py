"""Reading whole parameters that a sharded strategy split over the ranks, one module at a time.

A :class:`Gatherer` says how: :meth:`~Gatherer.gathered` makes every parameter of one module (its children's too)
readable in full for the duration of a ``with`` block, and :meth:`~Gatherer.full` turns one parameter read inside it
into its whole value. Three strategies keep parameters apart:

- none (one process, DDP, DeepSpeed ZeRO-2): every rank holds every parameter whole (:class:`Gatherer`).
- FSDP2: a parameter is a ``DTensor`` shard; ``full_tensor()`` gathers it (:class:`DTensorGatherer`).
- DeepSpeed ZeRO-3: a parameter's ``data`` is an empty tensor (numel 0) outside the forward/backward of the module
  that owns it; ``deepspeed.zero.GatheredParameters`` gathers a list of them (:class:`ZeroGatherer`).

Each is a collective where the parameters are sharded: every rank must gather the same modules in the same order.
The sparsity audit (``spp.training.callbacks.sparsity_audit``) and the streamed export (``spp.export.merged``) read
sharded models through it.
The CPU emulation of ZeRO-3's contract in ``tests/test_zero3_emulation.py`` is a fourth implementation.

ZeRO-3 also needs to know which parameters a module reads without calling their owner
(:meth:`spp.adapters.base.AdapterMethod.external_parameters`): :func:`register_external_parameters`. After training
under DeepSpeed the trained values are the optimizer's fp32 masters: :func:`deepspeed_master_tensors`.
"""

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
        """Inside the block every parameter of ``module`` (its children's too) can be read whole through
        :meth:`full`."""
        yield

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """The whole value of ``t`` (a parameter of the gathered module, or a tensor computed from them)."""
        return t


class DTensorGatherer(Gatherer):
    """FSDP2: a sharded parameter is a ``DTensor``; ``full_tensor()`` all-gathers it (plain tensors pass through).
    A module that is an FSDP2 unit (a decoder block, the root) is unsharded whole for the block (its parameters are
    then plain tensors in the module: what the streamed export merges) and resharded after."""

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


def is_zero3_parameter(p: torch.Tensor) -> bool:
    """Whether ``p`` is a DeepSpeed ZeRO-3 partitioned parameter (DeepSpeed gives each one a ``ds_id``)."""
    return hasattr(p, "ds_id")


def gatherer_for(model: nn.Module) -> Gatherer:
    """The gatherer for how ``model``'s parameters are held now: ZeRO-3 partitions, FSDP2 ``DTensor`` s or whole."""
    params = list(model.parameters())
    if any(is_zero3_parameter(p) for p in params):
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


@torch.no_grad()
def deepspeed_master_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Under DeepSpeed (ZeRO-2 or ZeRO-3): the trainable parameters' fp32 master values, whole, on CPU, by name.

    With ``precision=bf16-mixed`` DeepSpeed casts the whole module to bf16 and keeps the fp32 values in its
    optimizer, so the module's own copies are rounded; ``safe_get_full_fp32_param`` assembles the optimizer's
    (a collective: every rank calls it, parameter by parameter in the same order). A parameter DeepSpeed keeps no
    master for (fp32 ZeRO-2) is its own master.
    """
    from deepspeed.utils import safe_get_full_fp32_param

    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            master = safe_get_full_fp32_param(param)
            out[name] = (master if master is not None else param).detach().cpu().clone()
    return out
