"""``adapter=none``: no training; prune, audit, evaluate and export the pruned model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from spp.adapters.base import AdapterMethod, Masks, freeze_all
from spp.adapters.config import AdapterConfig
from spp.adapters.registry import register


class NoAdapter(AdapterMethod):
    """The pruned model as it is: every parameter frozen, merge is the identity, no adapter files."""

    name = "none"
    config_class = AdapterConfig
    trains = False

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        freeze_all(model)
        return model

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        return model, {}

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        """Nothing to write."""

    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """Nothing to load: the pruned model itself."""
        return self.inject(model, AdapterConfig(), masks), AdapterConfig()


METHOD = register(NoAdapter())
