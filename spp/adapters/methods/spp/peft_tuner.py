"""SPP as a registered peft method (``peft_type: SPP``): config, tuner layer, tuner model and loader.

``import spp.peft`` registers it; ``merge_and_unload()`` keeps every zero of the pruned weights (``docs/peft.md``).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from peft import PeftModel
from peft.config import PeftConfig
from peft.tuners.tuners_utils import (
    BaseTuner,
    BaseTunerLayer,
    _get_tuner_state_dict_key_prefixes,
    check_adapters_to_merge,
)
from torch import nn

from spp.adapters.base import WRAPPER_PREFIX, PeftIntegration
from spp.adapters.methods.spp.config import LAYER_KEYS
from spp.adapters.methods.spp.config import SPPAdapterConfig as _PaperDefaults
from spp.adapters.methods.spp.io import FORMAT, PEFT_TYPE
from spp.adapters.methods.spp.layer import SPPLinear, _check_settings, _divisors
from spp.adapters.peft_base import RecordedBaseTunerMixin, RecordedConfigMixin, read_peft_folder
from spp.projections import DEFAULT_TARGETS

PEFT_FIELDS = ("peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode")
"""peft's own config keys, kept when an ``adapter_config.json`` written by spp is read."""


def from_spp_format(saved: dict[str, Any]) -> dict[str, Any]:
    """:class:`SPPConfig` kwargs from spp's own ``adapter_config.json`` (spp-only records are dropped)."""
    missing = [k for k in ("targets", "layer_kwargs") if k not in saved]
    if missing:
        raise ValueError(f"adapter_config.json has format 'spp' but no {missing}: the file is damaged; write it "
                         "again with spp.adapters.methods.spp.io.save_adapter")
    kwargs = {k: saved[k] for k in PEFT_FIELDS if k in saved}
    kwargs.update(saved["layer_kwargs"], target_modules=list(saved["targets"]))
    return kwargs


@dataclass
class SPPConfig(RecordedConfigMixin, PeftConfig):
    """SPP (paper Sec. 3.2, Eq. 6) for ``peft.get_peft_model``, computed by spp's own ``SPPLinear``.

    ``target_modules=None`` (or the default list) means every linear projection of the decoder blocks; ``r`` must
    divide every target's out-features; ``spp_trained_on`` is the base the adapter folder records.
    """

    spp_name: ClassVar[str] = "spp"  # PeftType.SPP, adapter_config.json's "peft_type": "SPP"

    target_modules: list[str] | str | None = field(default_factory=lambda: list(DEFAULT_TARGETS))
    exclude_modules: list[str] | str | None = None
    r: int = _PaperDefaults.r
    scale: float = _PaperDefaults.scale
    dropout: float = _PaperDefaults.dropout
    alpha_init: str = str(_PaperDefaults.alpha_init)
    beta_init: str = str(_PaperDefaults.beta_init)
    use_beta: bool = _PaperDefaults.use_beta
    impl: str = str(_PaperDefaults.impl)
    residual: bool = _PaperDefaults.residual
    spp_trained_on: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.alpha_init, self.beta_init, self.impl = str(self.alpha_init), str(self.beta_init), str(self.impl)
        if isinstance(self.target_modules, (set, tuple)):
            self.target_modules = sorted(self.target_modules)
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"SPPConfig: r={self.r!r} must be an integer >= 1 that divides every target's "
                             "out_features")
        if not math.isfinite(self.scale):
            raise ValueError(f"SPPConfig: scale={self.scale} must be a finite number")
        # SPPLinear's own checks of every setting but the shape (m = r: r divides it)
        _check_settings("SPPConfig", self.r, self.r, self.impl, self.dropout, self.alpha_init, self.beta_init,
                        self.use_beta, self.residual)

    def layer_kwargs(self) -> dict[str, Any]:
        """The :class:`~spp.adapters.methods.spp.layer.SPPLinear` keyword arguments (``spp.inject``'s)."""
        return {key: getattr(self, key) for key in LAYER_KEYS}

    @classmethod
    def check_kwargs(cls, **kwargs: Any) -> dict[str, Any]:
        """Read spp's own ``adapter_config.json`` (``format: spp``, what ``train.py`` writes) as well as peft's."""
        if kwargs.get("format") == FORMAT:
            kwargs = from_spp_format(kwargs)
        return super().check_kwargs(**kwargs)


class SPPLayer(nn.Module, BaseTunerLayer):
    """A frozen pruned ``nn.Linear`` with SPP adapters (``spp_alpha``/``spp_beta``), as peft lays tuner layers out.

    Each adapter computes through its own ``SPPLinear`` (``spp_cores``, not a submodule). One adapter is applied at a
    time: SPP updates multiply the weight, so two active adapters do not add up.
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
        """Adapter ``adapter_name``'s ``SPPLinear``, synced with this layer's (peft may swap them) and mode."""
        core = self.spp_cores[adapter_name]
        core.spp_alpha = self.spp_alpha[adapter_name]
        if adapter_name in self.spp_beta:
            core.spp_beta = self.spp_beta[adapter_name]
        core.training = self.training
        return core

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Eq. 6 through the active adapter's ``SPPLinear``; the base layer alone when disabled or merged."""
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
        """Write ``W ⊙ (1 + s·Repeat0(alpha)⊙beta)`` into the base weight, zeros kept bit for bit (exact unmerge)."""
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


def check_loaded(model: nn.Module, adapter_name: str, state_dict: dict[str, torch.Tensor]) -> None:
    """Raise if ``state_dict`` (keys as in the model) does not hold exactly the model's SPP tensors, shapes included."""
    prefixes = _get_tuner_state_dict_key_prefixes(model, adapter_name=adapter_name)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()
                if any(k == p or k.startswith(p + ".") for p in prefixes)}
    mine = {k for k in state_dict if f".{SPPModel.prefix}" in k}
    missing, unexpected = sorted(set(expected) - mine), sorted(mine - set(expected))
    shapes = [k for k in sorted(mine & set(expected)) if tuple(state_dict[k].shape) != expected[k]]
    if missing or unexpected or shapes:
        what = (f"missing in the file {missing[:3]}" if missing else f"not in the model {unexpected[:3]}"
                if unexpected else f"other shape in the file {[(k, tuple(state_dict[k].shape)) for k in shapes[:2]]}")
        raise ValueError(f"SPP adapter tensors differ from the model ({what}); load the adapter on the base model and "
                         "target_modules / r it was trained with")


class SPPModel(RecordedBaseTunerMixin, BaseTuner):
    """Replaces each targeted ``nn.Linear`` by an :class:`SPPLayer`, in ``spp.inject``'s order (same init)."""

    prefix: str = "spp_"
    """peft's prefix of the method's tensors (``spp_alpha``, ``spp_beta``), as in spp's own adapter files."""

    tuner_layer_cls = SPPLayer
    target_module_mapping: dict[str, list[str]] = {}

    def _create_and_replace(self, peft_config: SPPConfig, adapter_name: str, target: nn.Module, target_name: str,
                            parent: nn.Module, current_key: str, parameter_name: str | None = None,
                            **kwargs: Any) -> None:
        if isinstance(target, SPPLayer):
            target.update_layer(adapter_name, peft_config)
            return
        if not isinstance(target, nn.Linear):
            raise ValueError(f"SPP adapts nn.Linear layers only, but target {current_key} is a "
                             f"{type(target).__name__}; leave it out of SPPConfig.target_modules")
        new_module = SPPLayer(target, adapter_name, peft_config, name=current_key)
        if adapter_name not in self.active_adapters:
            new_module.requires_grad_(False)  # an added adapter is not trainable until set_adapter
        self._replace_module(parent, target_name, new_module, target)

    @classmethod
    def _remap_adapter_state_dict_for_load(cls, model: nn.Module, config: PeftConfig, adapter_name: str,
                                           state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """peft's key mapping, also for spp's own files (no ``base_model.model.``), checked against the model."""
        if state_dict and not any(k.startswith(WRAPPER_PREFIX) for k in state_dict):
            state_dict = {WRAPPER_PREFIX + k: v for k, v in state_dict.items()}
        remapped = super()._remap_adapter_state_dict_for_load(model, config, adapter_name, state_dict)
        check_loaded(model, adapter_name, remapped)
        return remapped


def from_spp_adapter(model: nn.Module, directory: str | os.PathLike, adapter_name: str = "default",
                     is_trainable: bool = False, **kwargs: Any) -> PeftModel:
    """``PeftModel.from_pretrained`` for an SPP adapter folder, also one without ``"peft_type": "SPP"``."""
    path = Path(directory).expanduser()
    saved = read_peft_folder(path, directory, "an SPP adapter folder (a train.py run's <run_dir>/adapter)")
    if saved.get("peft_type", PEFT_TYPE) != PEFT_TYPE:  # none: a folder of before (format spp)
        raise ValueError(f"{str(directory)!r} is not an SPP adapter (peft_type={saved.get('peft_type')!r}); load it "
                         "with peft.PeftModel.from_pretrained")
    config = SPPConfig.from_pretrained(str(path))
    return PeftModel.from_pretrained(model, str(path), adapter_name=adapter_name, is_trainable=is_trainable,
                                     config=config, **kwargs)


SPP_PEFT = PeftIntegration(SPPConfig.spp_name, SPPConfig, SPPModel, SPPModel.prefix,
                           (SPPConfig, SPPLayer, SPPModel, from_spp_adapter))
"""What ``spp.peft`` registers with peft and exports for SPP."""
