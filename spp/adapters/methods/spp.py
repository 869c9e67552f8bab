"""``adapter=spp``: SPP (paper Sec. 3.2, Eq. 5/6); merge ``W ⊙ (1 + s·Repeat0(alpha)⊙beta)`` keeps every zero."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.adapters.base import DTYPES, AdapterMethod, ExternalParameters, Masks, MergedLayer, linear_tensors
from spp.adapters.config import AdapterConfig
from spp.adapters.spp.io import save_adapter
from spp.adapters.spp.layer import SPPLinear
from spp.adapters.spp.model import external_parameters, inject, merge_and_unload


def layer_kwargs(cfg: AdapterConfig) -> dict[str, Any]:
    """The :class:`~spp.adapters.spp.layer.SPPLinear` keyword arguments held by an ``adapter`` config."""
    return {"r": cfg.r, "scale": cfg.scale, "dropout": cfg.dropout, "alpha_init": str(cfg.alpha_init),
            "beta_init": str(cfg.beta_init), "use_beta": cfg.use_beta, "impl": str(cfg.impl),
            "residual": cfg.residual, "dtype": DTYPES[str(cfg.dtype)]}


class SPP(AdapterMethod):
    """SPP: alpha (r x n) and beta (m x 1) scale the frozen pruned weight element-wise."""

    name = "spp"

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        return inject(model, targets=tuple(cfg.targets), **layer_kwargs(cfg))

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        return merge_and_unload(model), {}

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        save_adapter(model, directory, extra_config=extra)

    def external_parameters(self, model: nn.Module) -> ExternalParameters:
        """Each ``SPPLinear`` reads ``base.weight`` / ``base.bias`` without calling ``base``."""
        return external_parameters(model)

    @torch.no_grad()
    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """An ``SPPLinear``'s merged weight ``W ⊙ (1 + s·Repeat0(alpha)⊙beta)`` (its own ``merge``, on a copy)."""
        if not isinstance(module, SPPLinear):
            return None
        layer = copy.deepcopy(module)
        if not layer.merged:
            layer.merge(keep_original=False)
        return MergedLayer(linear_tensors(layer.base))


METHOD = SPP()
