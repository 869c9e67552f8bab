"""lm-eval's ``HFLM`` over replicas: its documents split across the leaders of a :class:`ReplicaGroup`.

The model is always passed as an object: from a path ``HFLM`` makes an ``Accelerator`` that takes every torchrun rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lm_eval.models.huggingface import HFLM

from spp.eval.replicas import ReplicaGroup, max_memory_map, replica_devices

IN_MEMORY = "<in-memory model>"
"""``pretrained`` in the recorded model arguments of a model handed over as an object."""


class DistributedHFLM(HFLM):
    """An ``HFLM`` whose rank and world size are the replica index and count.

    ``pretrained`` is whole on this replica (one device, or a ``device_map``); this process must be a leader."""

    def __init__(self, pretrained: torch.nn.Module, tokenizer: Any, replicas: ReplicaGroup, **kwargs: Any) -> None:
        if not replicas.is_leader:
            raise RuntimeError("DistributedHFLM runs on replica leaders only (the others hold no model)")
        super().__init__(pretrained=pretrained, tokenizer=tokenizer, **kwargs)
        self.replicas = replicas
        self._rank, self._world_size = replicas.index, replicas.count

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every replica's ``tensor`` concatenated along dim 0 in replica order (a scalar counts as shape ``(1,)``)."""
        if self.replicas.group is None:
            return tensor
        host = tensor.detach().cpu()
        host = host[None] if host.ndim == 0 else host.contiguous()
        out = [torch.empty_like(host) for _ in range(self.replicas.count)]
        dist.all_gather(out, host, group=self.replicas.group)
        return torch.cat(out).to(tensor.device)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every replica's object in replica order on replica ``dst``; ``None`` on the others."""
        if self.replicas.group is None:
            return [obj]
        out: list[Any] | None = [None] * self.replicas.count if self.replicas.index == dst else None
        dist.gather_object(obj, out, group=self.replicas.group, group_dst=dst)
        return out

    def barrier(self) -> None:
        """Wait for every replica."""
        if self.replicas.group is not None:
            dist.barrier(group=self.replicas.group)


def load_replica_model(path: str | os.PathLike[str], devices: list[int], device: str | None = None,
                       max_memory_per_gpu: int | str | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Load a saved causal LM for one replica (in the dtype it was saved in), whole on ``device`` or spread over
    ``devices`` with accelerate's ``device_map="auto"``; returns it in eval mode with the lm-eval ``--model_args``
    placing it the same way."""
    from transformers import AutoModelForCausalLM

    dtype = "auto"
    args: dict[str, Any] = {"pretrained": str(path), "dtype": dtype}
    if device == "cpu" or not devices:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device or "cpu")
        args["device"] = device or "cpu"
    elif len(devices) == 1:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map={"": f"cuda:{devices[0]}"})
        args["device"] = f"cuda:{devices[0]}"
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map="auto",
                                                     max_memory=max_memory_map(devices, max_memory_per_gpu))
        args |= {"parallelize": True, "max_memory_per_gpu": max_memory_per_gpu, "devices": devices}
    return model.eval(), args


def replica_lm(model: torch.nn.Module | str | os.PathLike[str], tokenizer: Any, replicas: ReplicaGroup,
               batch_size: int | str = 1) -> tuple[DistributedHFLM, dict[str, Any]]:
    """This leader's :class:`DistributedHFLM` for an in-memory ``model`` or a model directory, and its equivalent
    ``--model_args``; ``tokenizer=None`` reads the directory's."""
    if isinstance(model, (str, Path)):
        module, args = load_replica_model(model, replica_devices(replicas))
        tokenizer = tokenizer if tokenizer is not None else str(model)
    else:  # an in-memory model comes with its tokenizer (evaluate_tasks checked)
        module, args = model, {"pretrained": IN_MEMORY, "device": str(next(model.parameters()).device)}
    lm = DistributedHFLM(module, tokenizer, replicas, batch_size=batch_size)
    return lm, {**args, "batch_size": batch_size}
