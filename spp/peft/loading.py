"""Load an adapter folder that spp wrote (``train.py``'s ``<run>/adapter``) as a peft model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from peft import PeftModel
from torch import nn

from spp.adapters.base import CONFIG_NAME, WEIGHTS_NAME, read_json_file
from spp.adapters.methods.spp.io import PEFT_TYPE
from spp.peft.config import SPPConfig


def from_spp_adapter(model: nn.Module, directory: str | os.PathLike, adapter_name: str = "default",
                     is_trainable: bool = False, **kwargs: Any) -> PeftModel:
    """``PeftModel.from_pretrained(model, directory)`` for an SPP adapter folder, including one written before
    ``save_adapter`` recorded ``"peft_type": "SPP"`` (which ``PeftModel.from_pretrained`` alone cannot read).

    Args:
        model: The pruned base model the adapter was trained on (plain HF module).
        directory: ``adapter_config.json`` + ``adapter_model.safetensors`` (spp's ``save_adapter`` or peft's
            ``save_pretrained`` of an SPP model).
        adapter_name, is_trainable, **kwargs: As ``PeftModel.from_pretrained``.

    Raises:
        FileNotFoundError: a file is missing. ValueError: not an SPP adapter, or tensors that differ from the model.
    """
    path = Path(directory).expanduser()
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (path / name).is_file():
            raise FileNotFoundError(f"No {name} in {str(directory)!r}; point at an SPP adapter folder (a train.py "
                                    "run's <run_dir>/adapter)")
    saved = read_json_file(path / CONFIG_NAME, key="adapter folder")
    if saved.get("peft_type", PEFT_TYPE) != PEFT_TYPE:  # none: a folder of before (format spp)
        raise ValueError(f"{str(directory)!r} is not an SPP adapter (peft_type={saved.get('peft_type')!r}); load it "
                         "with peft.PeftModel.from_pretrained")
    config = SPPConfig.from_pretrained(str(path))
    return PeftModel.from_pretrained(model, str(path), adapter_name=adapter_name, is_trainable=is_trainable,
                                     config=config, **kwargs)
