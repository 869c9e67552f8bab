"""One decoder block seen as a model of its own (at ``layers.0``), so an adapter method acts on it alone.
After the merge replaced modules are put back as the original objects: the offloaded model writes home through them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from spp.adapters.base import set_submodule
from spp.adapters.config import AdapterConfig
from spp.adapters.registry import apply_adapter, merge_adapter

BLOCK_PATH = "layers.0"


class OneBlock(nn.Module):
    """A module whose only decoder block is ``block`` (at ``layers.0``)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList([block])

    def prepare_inputs_for_generation(self, *args: Any, **kwargs: Any) -> Any:
        """Asked for by peft's causal-LM wrapper (``adapter=sparse_lora``); one block generates nothing."""
        raise TypeError("a single decoder block does not generate text")


class FormedBlock:
    """An onloaded block with a trainable form attached (:meth:`attach`) and later merged back (:meth:`merge`)."""

    def __init__(self, block: nn.Module, cfg: AdapterConfig, masks: dict[str, torch.Tensor]) -> None:
        self.cfg, self.masks = cfg, masks
        self.wrapper = OneBlock(block)
        self.modules = dict(self.wrapper.named_modules())
        self.params = {name: dict(m.named_parameters(recurse=False)) for name, m in self.modules.items()}

    def attach(self) -> list[nn.Parameter]:
        """Inject the form; the tensors to train (every one that requires grad afterwards)."""
        self.wrapper, _ = apply_adapter(self.wrapper, self.cfg, self.masks)
        return [p for p in self.wrapper.parameters() if p.requires_grad]

    @property
    def block(self) -> nn.Module:
        """The block as the forward pass uses it now (with the form while attached)."""
        return self.wrapper.get_submodule(BLOCK_PATH)

    @torch.no_grad()
    def merge(self) -> dict[str, Any]:
        """Merge the form into the block's weights, restore its original modules; returns the method's merge report."""
        merged, stats = merge_adapter(self.wrapper, self.cfg, self.masks)
        now = dict(merged.named_modules())
        for name in sorted(self.modules, key=lambda n: n.count(".")):
            original = self.modules[name]
            current = now.get(name)
            if current is None or current is original:
                continue
            own = dict(current.named_parameters(recurse=False))
            for pname, param in self.params[name].items():
                if pname in own and own[pname] is not param:
                    param.copy_(own[pname].to(param.dtype))
            set_submodule(merged, name, original)
            now = dict(merged.named_modules())
        for params in self.params.values():
            for param in params.values():
                param.requires_grad_(False)
        return stats
