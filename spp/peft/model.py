"""``SPPModel``: peft's tuner for SPP (what ``peft.get_peft_model`` builds for an :class:`~spp.peft.SPPConfig`)."""

from __future__ import annotations

from typing import Any

import torch
from peft.config import PeftConfig
from peft.tuners.tuners_utils import BaseTuner, _get_tuner_state_dict_key_prefixes
from torch import nn

from spp.models.conv1d import linearize_conv1d
from spp.peft.architecture import resolve_default_targets
from spp.peft.base_record import check_recorded_base
from spp.peft.config import SPPConfig
from spp.peft.layer import SPPLayer
from spp.peft.registration import PREFIX

PEFT_KEY_PREFIX = "base_model.model."
"""What peft puts before a module path in its adapter files; spp's own files (``save_adapter``) start at the model."""


def _adapter_keys(model: nn.Module, adapter_name: str) -> dict[str, tuple[int, ...]]:
    """The model's SPP tensors of ``adapter_name``: state-dict key -> shape."""
    prefixes = _get_tuner_state_dict_key_prefixes(model, adapter_name=adapter_name)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()
            if any(k == p or k.startswith(p + ".") for p in prefixes)}


def check_loaded(model: nn.Module, adapter_name: str, state_dict: dict[str, torch.Tensor]) -> None:
    """Raise if ``state_dict`` (keys as in the model) does not hold exactly the model's SPP tensors, shapes included."""
    expected = _adapter_keys(model, adapter_name)
    mine = {k for k in state_dict if f".{PREFIX}" in k}
    missing, unexpected = sorted(set(expected) - mine), sorted(mine - set(expected))
    shapes = [k for k in sorted(mine & set(expected)) if tuple(state_dict[k].shape) != expected[k]]
    if missing or unexpected or shapes:
        what = (f"missing in the file {missing[:3]}" if missing else f"not in the model {unexpected[:3]}"
                if unexpected else f"other shape in the file {[(k, tuple(state_dict[k].shape)) for k in shapes[:2]]}")
        raise ValueError(f"SPP adapter tensors differ from the model ({what}); load the adapter on the base model and "
                         "target_modules / r it was trained with")


class SPPModel(BaseTuner):
    """Replaces each targeted ``nn.Linear`` by an :class:`~spp.peft.layer.SPPLayer` (in ``named_modules`` order, as
    ``spp.inject``, so both draw the same initial tensors from the same seed).

    Any supported architecture: the default targets are the model's own block projections, and GPT-2's ``Conv1D``
    layers are held as ``nn.Linear`` first (:mod:`spp.peft.architecture`).
    """

    prefix: str = PREFIX
    tuner_layer_cls = SPPLayer
    target_module_mapping: dict[str, list[str]] = {}

    def _prepare_adapter_config(self, peft_config: PeftConfig, model_config: dict) -> PeftConfig:
        """``target_modules=None`` or the default list means every linear projection of the model's decoder blocks
        (the paper's seven on LLaMA); ``self.model`` is set by ``BaseTuner.__init__`` before this runs."""
        resolve_default_targets(peft_config, self.model)
        return peft_config

    def _prepare_model(self, peft_config: PeftConfig, model: nn.Module) -> None:
        """GPT-2's ``Conv1D`` layers become ``nn.Linear`` (their state dict keeps ``Conv1D``'s layout); a folder's
        adapter is refused on another base than the one it records
        (:func:`spp.peft.base_record.check_recorded_base`)."""
        linearize_conv1d(model)  # GPT-2's Conv1D held as nn.Linear, in place
        check_recorded_base(peft_config, model)

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
        """peft's key mapping, also for spp's own files (keys without ``base_model.model.``), checked to hold
        exactly the model's SPP tensors."""
        if state_dict and not any(k.startswith(PEFT_KEY_PREFIX) for k in state_dict):
            state_dict = {PEFT_KEY_PREFIX + k: v for k, v in state_dict.items()}
        remapped = super()._remap_adapter_state_dict_for_load(model, config, adapter_name, state_dict)
        check_loaded(model, adapter_name, remapped)
        return remapped
