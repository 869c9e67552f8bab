"""The adapters the benchmarks compare: SPP (every impl), peft LoRA, SparsePEFT and masked full fine-tuning.

SparsePEFT and masked full fine-tuning are self-contained functions: ``sparse_lora_linear`` /
``masked_full_linear`` for the layer benchmark, ``sparse_lora_model`` / ``masked_full_model`` for the model step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from spp.adapters.methods.masked_full.masked_full import inject_masked_full
from spp.adapters.methods.sparse_lora.layer import inject_sparse_lora
from spp.adapters.methods.spp.layer import IMPLS, SPPLinear

LORA_R, LORA_ALPHA = 8, 16  # the authors' LoRA setting (docs/design.md §1)


class _Holder(nn.Module):
    """One named linear layer so that peft can target it by name."""

    def __init__(self, proj: nn.Linear) -> None:
        super().__init__()
        self.proj = proj


def lora_linear(base: nn.Linear, dropout: float, r: int = LORA_R) -> nn.Module:
    """peft's LoRA layer (r, alpha 16) wrapped around ``base`` (shared, frozen)."""
    config = LoraConfig(r=r, lora_alpha=LORA_ALPHA, lora_dropout=dropout, target_modules=["proj"])
    return get_peft_model(_Holder(base), config).base_model.model.proj


def layer_variants(base: nn.Linear, dropout: float, r: int = 16,
                   impls: Iterable[str] = IMPLS) -> dict[str, nn.Module]:
    """``{"lora": ..., "spp-<impl>": ...}`` all sharing the frozen ``base``; SPP beta is random (trained-like)."""
    out: dict[str, nn.Module] = {"lora": lora_linear(base, dropout)}
    for impl in impls:
        layer = SPPLinear(base, r=r, dropout=dropout, beta_init="kaiming", impl=impl)
        out[f"spp-{impl}"] = layer
    return out


def lora_model(model: nn.Module, targets: Iterable[str], dropout: float, r: int = LORA_R) -> nn.Module:
    """peft LoRA (r, alpha 16) on ``targets`` of ``model`` (modified in place; the peft wrapper is returned)."""
    config = LoraConfig(r=r, lora_alpha=LORA_ALPHA, lora_dropout=dropout, target_modules=list(targets),
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def sparse_lora_linear(base: nn.Linear, mask: torch.Tensor | None, dropout: float, r: int = LORA_R) -> nn.Module:
    """SparsePEFT (peft LoRA r, alpha 16, update masked by ``mask``) around ``base`` (shared, frozen).

    ``mask`` (bool, out x in, True = kept) must zero-match ``base``'s pruned weights; ``None`` uses ``weight != 0``.
    """
    masks = None if mask is None else {"proj": mask}
    return inject_sparse_lora(_Holder(base), masks, targets=["proj"], r=r, alpha=LORA_ALPHA, dropout=dropout,
                              task_type=None).base_model.model.proj


def masked_full_linear(base: nn.Linear, mask: torch.Tensor | None) -> nn.Linear:
    """A trainable copy of ``base`` whose weight gradient is multiplied by ``mask`` (masked full fine-tuning).

    A copy, because the weight itself trains (the other variants share ``base`` frozen).
    """
    holder = _Holder(copy.deepcopy(base))
    masks = None if mask is None else {"proj": mask}
    return inject_masked_full(holder, masks, targets=["proj"]).proj


def sparse_lora_model(model: nn.Module, targets: Iterable[str], dropout: float, r: int = LORA_R,
                      masks: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
    """SparsePEFT (r, alpha 16) on ``targets`` of the pruned ``model`` (in place; the peft wrapper is returned).

    ``masks`` by module name (``model.layers.0.self_attn.q_proj``); ``None`` uses each weight's non-zeros.
    """
    return inject_sparse_lora(model, masks, targets=tuple(targets), r=r, alpha=LORA_ALPHA, dropout=dropout)


def masked_full_model(model: nn.Module, targets: Iterable[str],
                      masks: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
    """Masked full fine-tuning of ``targets`` of the pruned ``model`` (in place; refuses when it cannot fit)."""
    return inject_masked_full(model, masks, targets=tuple(targets))
