"""LoRA* (``adapter=lora``, the paper's Table 4 baseline) as a registered peft method (``peft_type: LORA_STAR``).

peft's own LoRA merge ``W~ + s·B A`` fills every pruned zero, so LoRA* folders say ``LORA_STAR``: without
``spp.peft`` peft refuses them; with it the merge adds ``s·(B A) ⊙ M`` (``M = W~ ≠ 0``, equal to re-masking).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from peft import LoraConfig, LoraModel, PeftModel
from torch import nn

from spp.adapters.base import PeftIntegration
from spp.adapters.peft_base import (
    MaskedLoraConfigMixin,
    MaskedLoraLinear,
    MaskedLoraModelMixin,
    from_folder,
    read_lora_settings,
)
from spp.adapters.registry import describe_dir

PEFT_TYPE = "LORA_STAR"
"""``adapter_config.json``'s ``peft_type`` of a LoRA* folder (:class:`LoraStarConfig`); ``LORA`` before."""


def read_lora_star_config(directory: str | Path) -> LoraConfig:
    """A LoRA* folder's LoRA settings (``LORA_STAR``, or ``LORA`` from before) as a plain ``LoraConfig``."""
    return read_lora_settings(directory, PEFT_TYPE, "LoRA*", "the adapter folder of an adapter=lora run")[0]


@dataclass
class LoraStarConfig(MaskedLoraConfigMixin, LoraConfig):
    """LoRA* for peft: a ``LoraConfig`` re-masking on merge; ``use_dora``/``fan_in_fan_out``/``lora_bias`` refused."""

    spp_name: ClassVar[str] = "lora_star"  # tensors are LoRA's (lora_A, lora_B)
    masks: ClassVar[str] = "LoRA* re-masks a plain LoRA update of nn.Linear layers"

    spp_trained_on: dict[str, Any] | None = None


class LoraStarLinear(MaskedLoraLinear):
    """peft ``lora.Linear`` whose (un)merge uses ``s·(B A) ⊙ M`` (``M = W~ ≠ 0`` at creation); forward is plain LoRA."""

    def __repr__(self) -> str:
        return "lora_star_" + super().__repr__()


class LoraStarModel(MaskedLoraModelMixin, LoraModel):
    """peft's LoRA tuner with :class:`LoraStarLinear` layers (:mod:`spp.adapters.peft_base`'s checks)."""

    layer_class: ClassVar[type[nn.Module]] = LoraStarLinear
    label: ClassVar[str] = "LoRA*"


def from_lora_star_adapter(model: nn.Module, directory: str | os.PathLike, adapter_name: str = "default",
                           is_trainable: bool = False, **kwargs: Any) -> PeftModel:
    """``PeftModel.from_pretrained`` for any ``adapter=lora`` folder, even an old ``"LORA"`` one.

    ``PeftModel.from_pretrained`` alone would merge such an old folder as plain LoRA, filling the pruned zeros.
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
