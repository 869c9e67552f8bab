"""``SPPLayer``: peft's tuner layer for SPP, holding one of spp's own ``SPPLinear`` per adapter."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from peft.tuners.tuners_utils import BaseTunerLayer, check_adapters_to_merge
from torch import nn

from spp.adapters.methods.spp.layer import SPPLinear
from spp.peft.config import SPPConfig


def _divisors(m: int, limit: int = 12) -> list[int]:
    return [d for d in range(1, m + 1) if m % d == 0][:limit]


class SPPLayer(nn.Module, BaseTunerLayer):
    """A frozen pruned ``nn.Linear`` (``base_layer``) with SPP adapters, as peft lays tuner layers out.

    Each adapter's tensors live in ``spp_alpha[name]`` (r x n) and ``spp_beta[name]`` (m x 1), so peft saves them as
    ``<module>.spp_alpha`` / ``<module>.spp_beta``: the names of spp's own adapter files. The computing is done by an
    :class:`~spp.adapters.methods.spp.layer.SPPLinear` per adapter (``spp_cores``, not a registered submodule: it
    shares ``base_layer`` and reads these parameters), so init, forward (Eq. 6), merge
    ``W ⊙ (1 + s·Repeat0(alpha)⊙beta)`` (zeros kept bit for bit) and unmerge are spp's own code.

    One adapter is applied at a time: SPP updates multiply the weight, so two active adapters do not add up.
    """

    adapter_layer_names: tuple[str, ...] = ("spp_alpha", "spp_beta")

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: SPPConfig, name: str = "") -> None:
        super().__init__()
        self.base_layer = base_layer
        self.spp_alpha = nn.ParameterDict({})
        self.spp_beta = nn.ParameterDict({})
        self.spp_cores: dict[str, SPPLinear] = {}
        self.layer_name = name
        self._disable_adapters = False
        self.merged_adapters: list[str] = []
        self._active_adapter = adapter_name
        base = self.get_base_layer()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.update_layer(adapter_name, config)

    def update_layer(self, adapter_name: str, config: SPPConfig) -> None:
        """Add adapter ``adapter_name``: an ``SPPLinear`` built as ``spp.inject`` builds it (same init and RNG use)."""
        m = self.out_features
        if m % config.r:
            raise ValueError(f"SPPConfig(r={config.r}) does not divide out_features={m} of {self.layer_name} (SPP "
                             f"repeats each row of alpha out_features/r times, Eq. 5); use r in {_divisors(m)}")
        core = SPPLinear(self.get_base_layer(), name=self.layer_name, **config.layer_kwargs())
        self.spp_cores[adapter_name] = core
        self.spp_alpha[adapter_name] = core.spp_alpha
        if core.spp_beta is not None:
            self.spp_beta[adapter_name] = core.spp_beta
        self.set_adapter(self.active_adapters, inference_mode=config.inference_mode)

    def core(self, adapter_name: str) -> SPPLinear:
        """Adapter ``adapter_name``'s ``SPPLinear``, reading this layer's current parameters and train/eval mode
        (peft may have replaced a parameter object, e.g. when casting its dtype)."""
        core = self.spp_cores[adapter_name]
        core.spp_alpha = self.spp_alpha[adapter_name]
        if adapter_name in self.spp_beta:
            core.spp_beta = self.spp_beta[adapter_name]
        core.training = self.training
        return core

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Eq. 6 through the active adapter's ``SPPLinear``; the base layer alone when adapters are disabled or
        merged."""
        if self.disable_adapters:
            if self.merged:
                self.unmerge()
            return self.base_layer(x, *args, **kwargs)
        active = [a for a in self.active_adapters if a in self.spp_cores]
        if self.merged or not active:
            return self.base_layer(x, *args, **kwargs)
        if len(active) > 1:
            raise ValueError(f"SPP applies one adapter at a time, {active} are active in {self.layer_name}: SPP "
                             "updates multiply the weight and do not add up; call set_adapter with one name")
        return self.core(active[0])(x)

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        """Write ``W ⊙ (1 + s·Repeat0(alpha)⊙beta)`` into the base weight (``SPPLinear.merge``: fp32 product rounded
        once, every zero kept bit for bit; the unmerged weight is kept for an exact ``unmerge``).

        Args:
            safe_merge: Undo the merge and raise if the merged weight is not finite.
            adapter_names: Adapters to merge, in order (default: the active ones).
        """
        for adapter in check_adapters_to_merge(self, adapter_names):
            if adapter not in self.spp_cores:
                continue
            core = self.core(adapter)
            core.merge(keep_original=True)
            if safe_merge and not torch.isfinite(self.get_base_layer().weight).all():
                core.unmerge()
                raise ValueError(f"SPP adapter {adapter!r} gives non-finite merged weights in {self.layer_name}; "
                                 "the adapter is broken (check its training), it was not merged")
            self.merged_adapters.append(adapter)

    def unmerge(self) -> None:
        """Restore the base weight as it was before :meth:`merge` (bit for bit), last merged adapter first."""
        if not self.merged:
            warnings.warn("Already unmerged. Nothing to do.", stacklevel=2)
            return
        while self.merged_adapters:
            self.core(self.merged_adapters.pop()).unmerge()

    def delete_adapter(self, adapter_name: str) -> None:
        super().delete_adapter(adapter_name)
        self.spp_cores.pop(adapter_name, None)

    def __repr__(self) -> str:
        return "spp." + super().__repr__()
