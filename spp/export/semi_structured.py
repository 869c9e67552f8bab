"""Export a merged 2:4 model's linear weights to PyTorch's semi-structured sparse format (CUDA only).

The merge keeps the 2:4 pattern (paper Sec. 3.2), so the projections run on sparse tensor cores (compute
capability 8.0+); on CPU there is no speed-up."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from spp.adapters.base import LinearWrapper
from spp.projections import DEFAULT_TARGETS, find_projections

SEMI_STRUCTURED_DTYPES = (torch.float16, torch.bfloat16)
MIN_ROWS, MIN_COLS = 32, 64  # CUTLASS fp16/bf16 tile constraints; cuSPARSELt's are looser


def count_2_4_violations(weight: torch.Tensor) -> int:
    """Number of groups of 4 consecutive inputs (per row) holding more than 2 non-zeros; 0 means valid 2:4."""
    if weight.dim() != 2 or weight.shape[1] % 4 != 0:
        raise ValueError(f"2:4 needs a 2-D weight with in_features divisible by 4, got shape {tuple(weight.shape)}.")
    nonzero = (weight != 0).reshape(weight.shape[0], -1, 4).sum(dim=-1)
    return int((nonzero > 2).sum())


def export_semi_structured(model: nn.Module, targets: Iterable[str] = DEFAULT_TARGETS) -> list[str]:
    """Convert the target ``nn.Linear`` weights of a merged fp16/bf16 CUDA model to 2:4 sparse tensors; their names.

    Every layer is checked (no adapter left, 2:4, dtype, shape) before any is converted."""
    targets = tuple(targets)
    if any(isinstance(m, LinearWrapper) or hasattr(m, "base_layer") for m in model.modules()):  # spp's or peft's
        raise ValueError("export_semi_structured: merge the adapters first (spp.merge_and_unload(model)).")
    found = list(find_projections(model, targets, "targets").items())  # the default: every block projection
    for name, mod in found:
        bad = count_2_4_violations(mod.weight.detach())
        if bad:
            raise ValueError(f"{name}: {bad} groups of 4 inputs keep more than 2 weights; the weight is not 2:4 "
                             "(prune with sparsity=nm2_4 and merge with spp.merge_and_unload).")
        rows, cols = mod.weight.shape
        if rows % MIN_ROWS or cols % MIN_COLS:
            raise ValueError(f"{name}: shape {(rows, cols)} is not a multiple of ({MIN_ROWS}, {MIN_COLS}) required "
                             "by the semi-structured kernels.")
    if not torch.cuda.is_available():
        raise RuntimeError("export_semi_structured: 2:4 semi-structured kernels need a CUDA GPU (sm80+); on CPU "
                           "there is no 2:4 speed-up, keep the dense merged model.")
    for name, mod in found:
        if mod.weight.device.type != "cuda" or mod.weight.dtype not in SEMI_STRUCTURED_DTYPES:
            raise ValueError(f"{name}: weight is {mod.weight.dtype} on {mod.weight.device}; move the model with "
                             "model.to('cuda', torch.bfloat16) (or float16) first.")
    from torch.sparse import to_sparse_semi_structured

    for _, mod in found:
        mod.weight = nn.Parameter(to_sparse_semi_structured(mod.weight.detach()), requires_grad=False)
    return [n for n, _ in found]
