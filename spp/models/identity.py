"""The identity of weights built in memory (a sha256 of the tensors), for the pruning and perplexity cache keys."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn

from spp.models.config import ModelConfig


@dataclass
class BuiltModelConfig(ModelConfig):
    """A :class:`ModelConfig` whose weights are identified by content: ``weights`` is :func:`weights_fingerprint`."""

    weights: str = ""


def _tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (empty for a ``meta`` tensor)."""
    if tensor.device.type == "meta":
        return ""
    data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(memoryview(data.numpy())).hexdigest()


def weights_fingerprint(model: nn.Module) -> str:
    """sha256 over every state-dict tensor's name, dtype, shape and bytes, hashed in threads (hashlib releases the GIL).

    Every byte is read: about 30 s for a 7B model in bf16 on a 2-core CPU."""
    state = model.state_dict(keep_vars=False)
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(_tensor_digest, state.values()))
    digest = hashlib.sha256()
    for (name, tensor), data in zip(state.items(), digests, strict=True):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}:{data};".encode())
    return digest.hexdigest()


def built_config(cfg: ModelConfig, fingerprint: str) -> BuiltModelConfig:
    """``cfg`` (name, dtype, ...) with its identity taken from ``fingerprint`` instead of its source."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelConfig)}
    return BuiltModelConfig(**fields, weights=fingerprint)
