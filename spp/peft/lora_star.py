"""LoRA* (``adapter=lora``, the paper's Table 4 baseline) as a registered peft method (``peft_type: LORA_STAR``).

LoRA* trains plain LoRA (``y = x W~ᵀ + s · dropout(x) (B A)ᵀ``) and re-masks the merge: ``(W~ + s·B A) ⊙ M``. peft's
own LoRA merge ``W~ + s·B A`` fills every pruned zero, so a ``train.py`` LoRA* folder says ``"peft_type":
"LORA_STAR"``: without ``import spp.peft`` peft refuses the unknown type; with it, :class:`LoraStarModel` loads it with
:class:`LoraStarLinear` layers whose forward is LoRA's and whose merge adds ``s·(B A) ⊙ M``, ``M = W~ ≠ 0`` taken from
the pruned base weight when the layer is made (equal to ``(W~ + s·B A) ⊙ M``: ``W~`` is zero off ``M``). Tensors and
file keys are LoRA's (``lora_A``, ``lora_B``). :func:`from_lora_star_adapter` also reads a LoRA* folder written
before (``"peft_type": "LORA"`` beside ``adapter_method.json``), which ``PeftModel.from_pretrained`` reads as plain
LoRA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, LoraModel, PeftModel
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from spp.adapters.bitmask import pack_rows, unpack_rows
from spp.adapters.methods.lora.method import PEFT_TYPE, read_lora_star_config
from spp.adapters.registry import describe_dir
from spp.models.conv1d import linearize_conv1d
from spp.peft.architecture import resolve_default_targets
from spp.peft.base_record import check, from_folder
from spp.peft.registration import LORA_STAR_NAME, peft_type

UNSUPPORTED = ("use_dora", "fan_in_fan_out", "lora_bias")
"""LoRA settings LoRA*'s re-masked merge has no form of here."""


@dataclass
class LoraStarConfig(LoraConfig):
    """LoRA* for peft: a ``LoraConfig`` (same keys and defaults) whose merge re-masks (``(W~ + s·B A) ⊙ M``).

    ``use_dora``, ``fan_in_fan_out`` and ``lora_bias`` are refused. ``spp_trained_on``: the base the folder records.
    """

    spp_trained_on: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = peft_type(LORA_STAR_NAME)
        bad = [key for key in UNSUPPORTED if getattr(self, key)]
        if bad:
            raise ValueError(f"LoraStarConfig: {bad[0]}={getattr(self, bad[0])!r} is not supported (LoRA* re-masks a "
                             "plain LoRA update of nn.Linear layers); leave it at its default")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, subfolder: str | None = None,
                        **kwargs: Any) -> LoraStarConfig:
        """peft's ``from_pretrained``, the folder's files checked and its recorded base in ``spp_trained_on``."""
        return from_folder(lambda: super(LoraStarConfig, cls).from_pretrained(pretrained_model_name_or_path,
                                                                              subfolder, **kwargs),
                           pretrained_model_name_or_path, subfolder)

    @classmethod
    def check_kwargs(cls, **kwargs: Any) -> dict[str, Any]:
        """Also reads a LoRA* folder of before (``"peft_type": "LORA"``) when asked for explicitly."""
        if kwargs.get("peft_type") == "LORA":
            kwargs["peft_type"] = PEFT_TYPE
        return super().check_kwargs(**kwargs)


class LoraStarLinear(LoraLinear):
    """peft ``lora.Linear`` whose merge (and unmerge) uses ``s·(B A) ⊙ M`` with ``M = W~ ≠ 0`` recorded (bit-packed,
    not saved) when the layer is made; its forward is plain LoRA, as LoRA* trains."""

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: LoraConfig, **kwargs: Any) -> None:
        super().__init__(base_layer, adapter_name, config=config, **kwargs)
        weight = self.get_base_layer().weight
        self.register_buffer("lora_star_mask_packed", pack_rows(weight.detach() != 0), persistent=False)

    def get_delta_weight(self, adapter: str) -> torch.Tensor:
        """``s · (B A) ⊙ M``: what peft's merge adds, so the pruned positions keep their zeros."""
        delta = super().get_delta_weight(adapter)
        mask = unpack_rows(self.lora_star_mask_packed, self.in_features).to(delta.device)
        return delta.masked_fill(~mask, 0.0)

    def __repr__(self) -> str:
        return "lora_star_" + super().__repr__()


class LoraStarModel(LoraModel):
    """peft's LoRA tuner with :class:`LoraStarLinear` layers; default targets and GPT-2 as in
    :mod:`spp.peft.architecture`; a folder's adapter is refused on another base than the one it records."""

    def _prepare_adapter_config(self, peft_config: LoraConfig, model_config: dict) -> LoraConfig:
        """``target_modules`` ``None`` or the default list: the model's block projections."""
        resolve_default_targets(peft_config, self.model)
        return super()._prepare_adapter_config(peft_config, model_config)

    def _prepare_model(self, peft_config: LoraConfig, model: nn.Module) -> None:
        linearize_conv1d(model)  # GPT-2's Conv1D held as nn.Linear, in place
        check(peft_config, model)
        super()._prepare_model(peft_config, model)

    @staticmethod
    def _create_new_module(lora_config: LoraConfig, adapter_name: str, target: nn.Module,
                           **kwargs: Any) -> nn.Module:
        """A ``LoraStarLinear`` (mask ``W~ ≠ 0`` of the base layer) for an ``nn.Linear`` target."""
        base = target.get_base_layer() if isinstance(target, BaseTunerLayer) else target
        if not isinstance(base, nn.Linear) or kwargs.get("parameter_name") is not None:
            raise ValueError(f"LoRA* adapts nn.Linear layers only, but target {kwargs.get('target_name')} is a "
                             f"{type(base).__name__}; leave it out of LoraStarConfig.target_modules")
        return LoraStarLinear(target, adapter_name, config=lora_config, **kwargs)


def from_lora_star_adapter(model: nn.Module, directory: str | os.PathLike, adapter_name: str = "default",
                           is_trainable: bool = False, **kwargs: Any) -> PeftModel:
    """``PeftModel.from_pretrained(model, directory)`` for any LoRA* folder of ``train.py`` (``adapter=lora``),
    including one written before it recorded ``"peft_type": "LORA_STAR"``, which ``PeftModel.from_pretrained`` alone
    would merge as plain LoRA (filling the pruned zeros).

    Raises:
        UserError: not an ``adapter=lora`` folder, a damaged file, or another base than the one it records.
    """
    path = Path(directory).expanduser()
    method, _ = describe_dir(path)
    if method.name != "lora":
        raise ValueError(f"{str(directory)!r} holds an adapter={method.name} folder, not LoRA*; load it with "
                         "peft.PeftModel.from_pretrained")
    saved = read_lora_star_config(path)
    config = from_folder(lambda: LoraStarConfig.from_peft_type(**{**saved.to_dict(), "peft_type": PEFT_TYPE}), path)
    return PeftModel.from_pretrained(model, str(path), adapter_name=adapter_name, is_trainable=is_trainable,
                                     config=config, **kwargs)
