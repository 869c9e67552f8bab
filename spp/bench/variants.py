"""The adapters the benchmarks compare: SPP (every impl) and peft LoRA on the same frozen linear layers."""

from __future__ import annotations

from collections.abc import Iterable

from peft import LoraConfig, get_peft_model
from torch import nn

from spp.adapters.spp.layer import IMPLS, SPPLinear

LORA_R, LORA_ALPHA = 8, 16  # the authors' LoRA setting (DESIGN.md §1)


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
