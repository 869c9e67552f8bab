"""ScaleLoRA (PERP, Zimmer et al., arXiv 2312.15230, Sec. 3): a pruned linear scaled element-wise by a rank-r product.

``W_eff = W ⊙ (B A)`` with ``A``, ``B`` at ``1/√r`` (so ``B A = 1``); merge ``W <- W ⊙ (B A)`` keeps every zero.
With ``P = (gᵀ x) ⊙ W``: ``dx = g W_eff``, ``dB = P Aᵀ``, ``dA = Bᵀ P`` (built transiently, in row chunks).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.adapters.base import (
    WEIGHTS_NAME,
    LinearWrapper,
    copy_tensors,
    freeze_all,
    read_adapter_files,
    save_tensor_file,
    set_submodule,
    wrap_targets,
    write_record,
)
from spp.adapters.chunks import ModulatedLowRankFunction

FORMAT = "scale_lora"
META_NAME = "scale_lora.json"


def scale_lora_product(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """``x (W ⊙ (B A))ᵀ + bias`` with the module docstring's hand-written gradients (``W``, ``bias`` frozen)."""
    return ModulatedLowRankFunction.apply(x, lora_a, lora_b, bias, weight, None)


class ScaleLoRALinear(LinearWrapper):
    """A frozen pruned ``nn.Linear`` scaled element-wise by ``B A``; ``A``/``B`` fp32 or the weight's dtype if wider."""

    def __init__(self, base: nn.Linear, r: int = 8, dtype: torch.dtype | None = None, name: str | None = None) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"{name or 'ScaleLoRALinear'}: wraps an nn.Linear, got {type(base).__name__}")
        self.base, self.r, self.name = base, int(r), name
        freeze_all(base)
        w = base.weight
        pdt = dtype or torch.promote_types(w.dtype, torch.float32)
        init = 1.0 / math.sqrt(r)
        self.scale_lora_A = nn.Parameter(torch.full((r, base.in_features), init, dtype=pdt, device=w.device))
        self.scale_lora_B = nn.Parameter(torch.full((base.out_features, r), init, dtype=pdt, device=w.device))

    def extra_repr(self) -> str:
        return f"r={self.r}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (W ⊙ (B A))ᵀ + bias``."""
        return scale_lora_product(x, self.base.weight, self.scale_lora_A, self.scale_lora_B, self.base.bias)

    @torch.no_grad()
    def multiplier(self) -> torch.Tensor:
        """``B A`` in fp32 (or wider), detached."""
        cdt = torch.promote_types(self.scale_lora_A.dtype, torch.float32)
        return self.scale_lora_B.detach().to(cdt) @ self.scale_lora_A.detach().to(cdt)

    @torch.no_grad()
    def merged_weight(self) -> tuple[torch.Tensor, int]:
        """``W ⊙ (B A)`` rounded once (zeros keep their bits), and how many non-zeros it turned into zeros."""
        w, factor = self.base.weight.detach(), self.multiplier()
        merged = torch.where(w == 0, w, (w.to(factor.dtype) * factor).to(w.dtype))
        return merged, int((merged == 0).sum() - (w == 0).sum())


def scale_lora_layers(model: nn.Module) -> dict[str, ScaleLoRALinear]:
    """Every :class:`ScaleLoRALinear` of ``model`` by module path."""
    return {n: m for n, m in model.named_modules() if isinstance(m, ScaleLoRALinear)}


def scale_lora_state_dict(layers: dict[str, ScaleLoRALinear]) -> dict[str, torch.Tensor]:
    """``<layer path>.scale_lora_A`` / ``.scale_lora_B`` of ``layers`` (detached): the adapter file's tensors."""
    return {f"{n}.{k}": getattr(lay, k).detach() for n, lay in layers.items() for k in ("scale_lora_A", "scale_lora_B")}


def inject_scale_lora(model: nn.Module, targets: Sequence[str], r: int = 8,
                      dtype: torch.dtype | None = None) -> nn.Module:
    """Replace every target ``nn.Linear`` by a :class:`ScaleLoRALinear` and freeze everything else."""
    return wrap_targets(model, targets, ScaleLoRALinear, "inject_scale_lora", "merge_scale_lora", r=r, dtype=dtype)


@torch.no_grad()
def merge_scale_lora(model: nn.Module) -> tuple[nn.Module, dict[str, Any]]:
    """``W <- W ⊙ (B A)`` in every ScaleLoRA layer, plain linear back; returns ``{"layers", "made_zero"}``."""
    layers = scale_lora_layers(model)
    if not layers:
        raise ValueError("merge_scale_lora: the model holds no ScaleLoRA layer (nothing to merge)")
    made_zero = 0
    for name, layer in layers.items():
        merged, lost = layer.merged_weight()
        layer.base.weight.copy_(merged)
        made_zero += lost
        set_submodule(model, name, layer.base)
    if made_zero:
        warnings.warn(f"ScaleLoRA merge turned {made_zero} non-zero weights into zeros (a factor B A of 0, or "
                      "underflow in the weight dtype)", stacklevel=2)
    return model, {"layers": len(layers), "made_zero": made_zero}


def save_scale_lora(model: nn.Module, directory: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
    """``adapter_model.safetensors`` (``<layer>.scale_lora_A``/``_B``) and ``scale_lora.json``."""
    layers = scale_lora_layers(model)
    if not layers:
        raise ValueError("save_scale_lora: the model holds no ScaleLoRA layer; inject it first")
    out = Path(directory)
    save_tensor_file(out / WEIGHTS_NAME, scale_lora_state_dict(layers))
    write_record(out / META_NAME, FORMAT, extra, r=next(iter(layers.values())).r, layers=sorted(layers),
                 targets=sorted({n.rsplit(".", 1)[-1] for n in layers}))
    return out


def load_scale_lora(model: nn.Module, directory: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """Inject ScaleLoRA as :func:`save_scale_lora` recorded it and load ``A``/``B`` bit-exactly; returns both."""
    meta, state = read_adapter_files(directory, META_NAME, WEIGHTS_NAME, FORMAT, "ScaleLoRA")
    inject_scale_lora(model, meta["targets"], r=int(meta["r"]), dtype=next(iter(state.values())).dtype)
    layers = scale_lora_layers(model)
    if sorted(layers) != meta["layers"]:
        raise ValueError(f"load_scale_lora: the model's ScaleLoRA layers differ from {directory}'s (e.g. "
                         f"{sorted(set(layers) ^ set(meta['layers']))[:3]}); load it on the pruned model it was "
                         "trained on")
    copy_tensors(state, scale_lora_state_dict(layers), "load_scale_lora")
    return model, meta
