"""``adapter=scale_lora``: PERP's ScaleLoRA (Zimmer et al., arXiv 2312.15230): ``W ⊙ (B A)``, merged in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.adapters.base import (
    AdapterMethod,
    ExternalParameters,
    Full,
    Masks,
    MergedLayer,
    linear_tensors,
    wrapper_reads,
)
from spp.adapters.config import AdapterConfig
from spp.adapters.methods.scale_lora.config import ScaleLoRAConfig
from spp.adapters.methods.scale_lora.layer import (
    ScaleLoRALinear,
    inject_scale_lora,
    load_scale_lora,
    merge_scale_lora,
    save_scale_lora,
    scale_lora_layers,
)


class ScaleLoRA(AdapterMethod):
    """``W ⊙ (B A)`` with ``B`` (m x r), ``A`` (r x n) at ``1/√r``: a zero of ``W`` stays zero whatever ``B A`` is."""

    name = "scale_lora"
    config_class = ScaleLoRAConfig
    summed_stats = ("made_zero",)  # as merge_scale_lora reports

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        return inject_scale_lora(model, tuple(cfg.targets), r=cfg.r, dtype=cfg.torch_dtype)

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        return merge_scale_lora(model)

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        save_scale_lora(model, directory, extra)

    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """``scale_lora.json`` + ``adapter_model.safetensors`` (:func:`load_scale_lora`)."""
        with self.refusing_other_files(directory):
            model, meta = load_scale_lora(model, directory)
        return model, ScaleLoRAConfig(targets=list(meta["targets"]), r=int(meta["r"]))

    def external_parameters(self, model: nn.Module) -> ExternalParameters:
        """Each ScaleLoRA layer reads ``base.weight`` / ``base.bias`` without calling ``base``."""
        return wrapper_reads(scale_lora_layers(model).values())

    def effective_weight(self, module: nn.Module, full: Full) -> torch.Tensor | None:
        """``W ⊙ (B A)`` in fp32 (or wider) from the gathered tensors."""
        if not isinstance(module, ScaleLoRALinear):
            return None
        cdt = torch.promote_types(module.scale_lora_A.dtype, torch.float32)
        factor = full(module.scale_lora_B.detach()).to(cdt) @ full(module.scale_lora_A.detach()).to(cdt)
        return full(module.base.weight.detach()).to(cdt) * factor

    @torch.no_grad()
    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """A ScaleLoRA layer's ``W ⊙ (B A)`` in the weight's dtype (zeros copied), with the weights it made zero."""
        if not isinstance(module, ScaleLoRALinear):
            return None
        merged, made_zero = module.merged_weight()
        return MergedLayer({**linear_tensors(module.base), "weight": merged}, {"made_zero": made_zero})

METHOD = ScaleLoRA()
