"""GPT-2's ``Conv1D`` projections held as ``nn.Linear`` (``W.T``), so every pruner and adapter sees one layout.

The ``state_dict`` and :func:`conv1d_layout` give the tensors back in ``Conv1D``'s ``[in, out]`` layout, so saved
checkpoints stay plain GPT-2."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

CONV1D_NAME = "Conv1D"


class Conv1DAsLinear(nn.Linear):
    """An ``nn.Linear`` standing in for a ``Conv1D``; its state dict stores the weight as ``Conv1D`` does."""

    def __init__(self, conv: nn.Module) -> None:
        n_in, n_out = conv.weight.shape
        super().__init__(n_in, n_out, bias=getattr(conv, "bias", None) is not None, device="meta")
        self.weight = nn.Parameter(conv.weight.detach().t().contiguous(), requires_grad=conv.weight.requires_grad)
        if self.bias is not None:
            self.bias = conv.bias
        self._register_state_dict_hook(_transpose_weight)
        self._register_load_state_dict_pre_hook(_transpose_weight, with_module=True)


_NATIVE: list[bool] = [False]


@contextmanager
def native_layout() -> Iterator[None]:
    """State dicts in memory's layout for the duration (``nn.Linear``'s ``[out, in]``): for code that moves tensors
    between modules of the same model, such as FSDP2's ``set_model_state_dict(..., broadcast_from_rank0=True)``."""
    _NATIVE[0] = True
    try:
        yield
    finally:
        _NATIVE[0] = False


def _transpose_weight(module: nn.Module, state: dict[str, Any], prefix: str, *_args: Any) -> None:
    """The state-dict hook (to ``Conv1D``'s layout) and the load pre-hook (from it): the weight transposed."""
    key = prefix + "weight"
    if key in state and not _NATIVE[0]:
        state[key] = state[key].t()


def is_conv1d(module: nn.Module) -> bool:
    """A transformers ``Conv1D`` (weight ``[in, out]``)."""
    return type(module).__name__ == CONV1D_NAME and isinstance(getattr(module, "weight", None), torch.Tensor)


def linearize_conv1d(model: nn.Module) -> int:
    """Replace every ``Conv1D`` of ``model`` by a :class:`Conv1DAsLinear` holding the same numbers (the weight
    transposed); returns how many were replaced (0 for any model without them)."""
    found = [(name, module) for name, module in model.named_modules() if is_conv1d(module)]
    for name, module in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Conv1DAsLinear(module))
    return len(found)


def conv1d_weights(model: nn.Module) -> set[str]:
    """Qualified names of the weights held transposed (``transformer.h.0.attn.c_attn.weight``), as the merged model
    names them: a projection an adapter wraps (``....c_attn.base``) is named by the adapter layer's path."""
    names = set()
    for name, module in model.named_modules():
        if isinstance(module, Conv1DAsLinear):
            owner, _, leaf = name.rpartition(".")
            names.add(f"{owner if leaf in ('base', 'base_layer') else name}.weight")
    return names


def conv1d_layout(tensors: Mapping[str, torch.Tensor], transposed: set[str]) -> dict[str, torch.Tensor]:
    """``tensors`` (by plain name) with each weight named in ``transposed`` back in ``Conv1D``'s ``[in, out]``."""
    return {k: (v.t().contiguous() if k in transposed else v) for k, v in tensors.items()}
