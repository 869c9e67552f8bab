"""LoRA* (``adapter=lora``, the paper's Table 4 baseline) as a registered peft method (``peft_type: LORA_STAR``).

LoRA* trains plain LoRA (``y = x W~ᵀ + s · dropout(x) (B A)ᵀ``) and re-masks the merge: ``(W~ + s·B A) ⊙ M``. peft's
own LoRA merge ``W~ + s·B A`` fills every pruned zero, so a ``train.py`` LoRA* folder says ``"peft_type":
"LORA_STAR"``: without ``import spp.peft`` peft refuses the unknown type; with it (:data:`LORA_STAR_PEFT`),
:class:`LoraStarModel` loads it with :class:`LoraStarLinear` layers whose forward is LoRA's and whose merge adds
``s·(B A) ⊙ M``, ``M = W~ ≠ 0`` taken from the pruned base weight when the layer is made (equal to
``(W~ + s·B A) ⊙ M``: ``W~`` is zero off ``M``). Tensors and file keys are LoRA's (``lora_A``, ``lora_B``).
:func:`from_lora_star_adapter` also reads a LoRA* folder written before (``"peft_type": "LORA"`` beside
``adapter_method.json``), which ``PeftModel.from_pretrained`` reads as plain LoRA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from peft import LoraConfig, LoraModel, PeftModel
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn

from spp.adapters.base import PeftIntegration
from spp.adapters.peft_base import MaskedLoraConfigMixin, MaskedLoraModelMixin, from_folder, read_lora_settings
from spp.adapters.registry import describe_dir
from spp.bitmask import pack_rows, unpack_rows

PEFT_TYPE = "LORA_STAR"
"""``adapter_config.json``'s ``peft_type`` of a LoRA* folder (:class:`LoraStarConfig`); ``LORA`` before."""


def read_lora_star_config(directory: str | Path) -> LoraConfig:
    """The LoRA settings of a LoRA* folder (``peft_type`` ``LORA_STAR``, or ``LORA`` from before) as a plain
    ``LoraConfig`` (:func:`~spp.adapters.peft_base.read_lora_settings`; ``spp.peft`` need not be imported)."""
    return read_lora_settings(directory, PEFT_TYPE, "LoRA*", "the adapter folder of an adapter=lora run")[0]


@dataclass
class LoraStarConfig(MaskedLoraConfigMixin, LoraConfig):
    """LoRA* for peft: a ``LoraConfig`` (same keys and defaults) whose merge re-masks (``(W~ + s·B A) ⊙ M``).

    ``use_dora``, ``fan_in_fan_out`` and ``lora_bias`` are refused. ``spp_trained_on``: the base the folder records.
    """

    spp_name: ClassVar[str] = "lora_star"  # PeftType.LORA_STAR; tensors are LoRA's (lora_A, lora_B)
    masks: ClassVar[str] = "LoRA* re-masks a plain LoRA update of nn.Linear layers"

    spp_trained_on: dict[str, Any] | None = None


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


class LoraStarModel(MaskedLoraModelMixin, LoraModel):
    """peft's LoRA tuner with :class:`LoraStarLinear` layers; default targets and GPT-2 as in
    :mod:`spp.adapters.peft_base`; a folder's adapter is refused on another base than the one it records."""

    layer_class: ClassVar[type[nn.Module]] = LoraStarLinear
    label: ClassVar[str] = "LoRA*"


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


LORA_STAR_PEFT = PeftIntegration(LoraStarConfig.spp_name, LoraStarConfig, LoraStarModel, LoraStarModel.prefix,
                                 (LoraStarConfig, LoraStarModel, LoraStarLinear, from_lora_star_adapter))
"""What ``spp.peft`` registers with peft and exports for LoRA*."""
