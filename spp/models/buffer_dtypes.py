"""Cast a causal LM to a dtype as ``from_pretrained(dtype=...)`` leaves it: floating buffers keep transformers' dtype.

RoPE's ``inv_freq`` stays float32 in a bfloat16 model; ``nn.Module.to(bfloat16)`` would round it (an angle error of
up to 2.5 rad at position 2047 for head_dim 128)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


def pretrained_buffer_dtypes(config: Any, dtype: torch.dtype) -> dict[str, torch.dtype]:
    """The dtype of each floating buffer of the model transformers builds for ``config`` in ``dtype`` (built on the
    ``meta`` device: nothing is allocated), by name."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=dtype)
    return {name: b.dtype for name, b in reference.named_buffers() if b.is_floating_point()}


def cast_like_pretrained(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``model.to(dtype)``, except that a floating buffer transformers keeps in another dtype (RoPE's float32
    frequencies) keeps its own values, cast to that dtype instead. Returns ``model``."""
    config = getattr(model, "config", None)
    wanted = pretrained_buffer_dtypes(config, dtype) if config is not None else {}
    kept = {name: b for name, b in model.named_buffers() if b.is_floating_point() and wanted.get(name, dtype) != dtype}
    model = model.to(dtype)
    for name, buffer in kept.items():
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = buffer.to(wanted[name])
    return model
