"""Adapter files: ``adapter_config.json`` + ``adapter_model.safetensors`` holding only alpha and beta."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from spp.adapters.base import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    copy_tensors,
    load_tensor_file,
    read_json_file,
    save_tensor_file,
    write_record,
)
from spp.adapters.methods.spp.config import LAYER_KEYS
from spp.adapters.methods.spp.model import adapter_state_dict, inject, spp_layers

FORMAT = "spp"
PEFT_TYPE = "SPP"
"""``adapter_config.json``'s ``peft_type`` (peft reads it once ``spp.peft`` is imported)."""

OUTPUT_KEYS = ("scale", "residual")
"""The recorded settings besides the tensors' shapes that change what a loaded adapter computes."""


def save_adapter(model: nn.Module, directory: str | os.PathLike, extra_config: dict[str, Any] | None = None) -> Path:
    """Write ``model``'s SPP parameters and settings (``adapter_config.json``, ``adapter_model.safetensors``).

    The folder is also a peft adapter (``peft_type`` SPP). ValueError: no SPP layers, a merged one, or mixed settings.
    """
    layers = spp_layers(model)
    if not layers:
        raise ValueError("save_adapter: the model holds no SPPLinear layers; call spp.inject first.")
    merged = [n for n, lay in layers.items() if lay.merged]
    if merged:
        raise ValueError(f"save_adapter: layers {merged[:3]} are merged; unmerge() them before saving.")
    kwargs = {n: {key: getattr(lay, "dropout_p" if key == "dropout" else key) for key in LAYER_KEYS}
              for n, lay in layers.items()}
    first_name, first = next(iter(kwargs.items()))
    for n, kw in kwargs.items():
        if kw != first:
            raise ValueError(f"save_adapter: layer {n} has settings {kw} but {first_name} has {first}; "
                             "one adapter file holds one setting for all layers.")
    out = Path(directory)
    save_tensor_file(out / WEIGHTS_NAME, adapter_state_dict(model))
    write_record(out / CONFIG_NAME, FORMAT, extra_config, peft_type=PEFT_TYPE, layers=list(layers), layer_kwargs=first,
                 targets=sorted({n.rsplit(".", 1)[-1] for n in layers}))
    return out


def read_adapter_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``adapter_config.json`` of an adapter directory (checked to be an SPP adapter)."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"No {CONFIG_NAME} in {directory}; expected a directory written by save_adapter.")
    config = read_json_file(path)
    if config.get("format") != FORMAT:
        raise ValueError(f"{path} is not an SPP adapter (format={config.get('format')!r}, expected {FORMAT!r}).")
    return config


def load_adapter(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Load alpha/beta written by ``save_adapter`` into ``model`` (injecting first if needed; bit-exact)."""
    config = read_adapter_config(directory)
    weights = Path(directory) / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"No {WEIGHTS_NAME} in {directory}; the adapter directory is incomplete.")
    if not spp_layers(model):
        inject(model, targets=config["targets"], **config["layer_kwargs"])
    layers = spp_layers(model)
    if set(layers) != set(config["layers"]):
        missing = sorted(set(config["layers"]) - set(layers))[:5]
        unexpected = sorted(set(layers) - set(config["layers"]))[:5]
        raise ValueError(f"load_adapter: SPP layers differ from {directory}: missing in model {missing}, "
                         f"not in the file {unexpected}. Use the same model architecture and targets.")
    for name, layer in layers.items():
        bad = [k for k in OUTPUT_KEYS if getattr(layer, k) != config["layer_kwargs"][k]]
        if bad:
            key = bad[0]
            raise ValueError(f"load_adapter: layer {name} has {key}={getattr(layer, key)} but {directory} records "
                             f"{key}={config['layer_kwargs'][key]}; inject with the file's settings or load into a "
                             "model without SPP layers.")
    copy_tensors(load_tensor_file(weights), adapter_state_dict(model), "load_adapter")
    return model
