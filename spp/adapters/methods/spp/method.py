"""``adapter=spp``: SPP (paper Sec. 3.2, Eq. 5/6); merge ``W ⊙ (1 + s·Repeat0(alpha)⊙beta)`` keeps every zero."""

from __future__ import annotations

import copy
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
    PeftIntegration,
    Shapes,
    linear_tensors,
    wrapper_reads,
)
from spp.adapters.config import AdapterConfig
from spp.adapters.methods.spp.config import LAYER_KEYS, Impl, SPPAdapterConfig
from spp.adapters.methods.spp.functional import BACKWARD_CHUNK_ELEMENTS, adapted_weight, merge_factor
from spp.adapters.methods.spp.io import load_adapter, read_adapter_config, save_adapter
from spp.adapters.methods.spp.layer import SPPLinear
from spp.adapters.methods.spp.model import inject, merge_and_unload, spp_layers
from spp.choices import Choice
from spp.errors import UserError


def layer_kwargs(cfg: SPPAdapterConfig) -> dict[str, Any]:
    """The ``SPPLinear`` keyword arguments an ``adapter=spp`` config holds (a choice as its bare value)."""
    values = {key: getattr(cfg, key) for key in LAYER_KEYS}
    return {**{k: str(v) if isinstance(v, Choice) else v for k, v in values.items()}, "dtype": cfg.torch_dtype}


def check_rank_divides(r: int, outs: dict[str, int]) -> None:
    """UserError naming ``adapter.r`` and the ranks that fit unless ``r`` divides every out-feature count (Eq. 6)."""
    bad = {p: o for p, o in outs.items() if o % int(r)}
    if bad:
        ok = [d for d in range(1, 65) if all(o % d == 0 for o in outs.values())]
        name, out = next(iter(bad.items()))
        raise UserError(f"adapter.r={r} does not divide out_features={out} of {name} (SPP repeats each row of alpha "
                        "out_features/r times, Eq. 6)", f"use adapter.r in {ok}", key="adapter.r")


class SPP(AdapterMethod):
    """SPP: alpha (r x n) and beta (m x 1) scale the frozen pruned weight element-wise."""

    name = "spp"
    reconstruct_lr = 1e-1  # chosen on validation PPL, SmolLM2-135M Wanda 2:4 (reconstruction_smollm2_135m.md)
    config_class = SPPAdapterConfig

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        return inject(model, targets=tuple(cfg.targets), **layer_kwargs(cfg))

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        return merge_and_unload(model), {}

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        save_adapter(model, directory, extra_config=extra)

    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """``adapter_config.json`` + ``adapter_model.safetensors`` (:func:`~.io.load_adapter`)."""
        with self.refusing_other_files(directory):
            config = read_adapter_config(directory)
            model = load_adapter(model, directory)
        return model, SPPAdapterConfig(targets=list(config["targets"]), **config["layer_kwargs"])

    def train_flops(self, adapted_weights: int, trainable: int, dropout: float) -> int:
        """``G = gᵀx`` per adapted linear (``2 N_a``); with dropout a second full-size product (``+4 N_a``)."""
        return 2 * adapted_weights + (4 * adapted_weights if dropout > 0 else 0)

    def forward_transient_values(self, largest_weight: int) -> int:
        """The merged weight ``W'`` of Eq. 6, built in forward."""
        return largest_weight

    def backward_transient_bytes(self, largest_weight: int) -> int:
        """The fused backward's row chunk of ``W'`` and of its gradient (fp32, ``BACKWARD_CHUNK_ELEMENTS`` at most)."""
        return 2 * 4 * min(largest_weight, BACKWARD_CHUNK_ELEMENTS)

    def keeps_merged_weights(self, cfg: AdapterConfig) -> bool:
        """``impl=fused_cached`` keeps each forward's ``W'`` for its backward."""
        return str(getattr(cfg, "impl", "")) == str(Impl.fused_cached)

    def preflight(self, cfg: AdapterConfig, shapes: Shapes | None) -> None:
        """``adapter.scale`` > 0, and ``r`` divides every adapted projection's out-features."""
        if not cfg.scale > 0:
            raise UserError(f"adapter.scale={cfg.scale} must be a finite number > 0",
                            "set adapter.scale to a positive number", key="adapter.scale")
        if shapes:
            check_rank_divides(cfg.r, {p: out for p, (_in, out) in shapes.items()})

    def external_parameters(self, model: nn.Module) -> ExternalParameters:
        """Each ``SPPLinear`` reads ``base.weight`` / ``base.bias`` without calling ``base``."""
        return wrapper_reads(spp_layers(model).values())

    def effective_weight(self, module: nn.Module, full: Full) -> torch.Tensor | None:
        """An unmerged ``SPPLinear``'s adapted weight (Eq. 5/6, residual or not); a merged one's own weight."""
        if not isinstance(module, SPPLinear):
            return None
        w = full(module.base.weight)
        if module.merged:
            return w
        alpha = full(module.spp_alpha.detach()).float()
        beta = full(module.spp_beta.detach()).float() if module.spp_beta is not None else None
        if module.residual:
            return w.float() * merge_factor(alpha, beta, module.out_features, module.scale)
        return adapted_weight(w.float(), alpha, beta)

    @torch.no_grad()
    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """An ``SPPLinear``'s merged weight ``W ⊙ (1 + s·Repeat0(alpha)⊙beta)`` (its own ``merge``, on a copy)."""
        if not isinstance(module, SPPLinear):
            return None
        layer = copy.deepcopy(module)
        if not layer.merged:
            layer.merge(keep_original=False)
        return MergedLayer(linear_tensors(layer.base))

    def peft_integration(self) -> PeftIntegration:
        """SPP as a registered peft method (``methods/spp/peft_tuner.py``)."""
        from spp.adapters.methods.spp.peft_tuner import SPP_PEFT  # start-up time: the tuner loads when spp.peft asks

        return SPP_PEFT


METHOD = SPP()
