"""LoSA's layers: SparsePEFT's masked LoRA with one rank per decoder block (peft's ``rank_pattern``) and one
scaling ``s = lora_alpha / r`` for all (peft's ``alpha_pattern``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel
from torch import nn

from spp.adapters.base import read_json_file
from spp.adapters.methods.sparse_lora.layer import META_NAME, load_masked, wrap_masked
from spp.projections import decoder_layers, find_projections


def layer_ranks(model: nn.Module, targets: Sequence[str], ranks: Sequence[int]) -> dict[str, int]:
    """``{layer name: its block's rank}`` for the projections ``targets`` names (one rank per decoder block)."""
    prefix = decoder_layers(model)[0]  # len(ranks) is the blocks' count (losa.method.block_ranks checked it)
    names = find_projections(model, targets, "adapter.targets")
    return {name: int(ranks[int(re.match(rf"{re.escape(prefix)}\.(\d+)\.", name).group(1))]) for name in names}


def inject_losa(model: nn.Module, masks: Mapping[str, torch.Tensor] | None, ranks: Mapping[str, int], r: int,
                alpha: float, dropout: float, dtype: torch.dtype = torch.float32) -> PeftModel:
    """Wrap the layers of ``ranks`` with masked LoRA of that rank, all scaled by ``alpha / r`` (``B = 0``)."""
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=sorted(ranks), bias="none",
                        task_type="CAUSAL_LM", rank_pattern={re.escape(n): k for n, k in ranks.items()},
                        alpha_pattern={re.escape(n): alpha * k / r for n, k in ranks.items()})
    return wrap_masked(model, config, masks, dtype, "losa")


def block_targets(model: nn.Module, target_modules: Sequence[str]) -> list[str]:
    """In-block names of peft's saved ``target_modules``: peft keeps full paths (``model.layers.0.mlp.up_proj`` ->
    ``mlp.up_proj``) when it lists fewer than 20 modules and shortens them to leaf names from 20 on."""
    try:
        prefix = re.escape(decoder_layers(model)[0])
    except ValueError:  # no decoder blocks (a unit test's Sequential): the names as saved
        return sorted(target_modules)
    return sorted({re.sub(rf"^{prefix}\.\d+\.", "", t) for t in target_modules})


def load_losa(model: nn.Module, directory: str | os.PathLike,
              masks: Mapping[str, torch.Tensor] | None = None) -> tuple[PeftModel, LoraConfig]:
    """The LoSA model :meth:`save` wrote, re-created on the same pruned base ``model``, and its LoRA settings."""
    meta_path = Path(directory) / META_NAME
    if not meta_path.is_file():
        raise FileNotFoundError(f"No {META_NAME} in {directory}; expected a directory written by adapter=losa")

    def inject(config: LoraConfig, dtype: torch.dtype) -> PeftModel:
        config.target_modules = block_targets(model, config.target_modules)
        names = find_projections(model, config.target_modules, "target_modules")
        ranks = {n: int(config.rank_pattern.get(re.escape(n), config.r)) for n in names}
        return inject_losa(model, masks, ranks, r=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                           dtype=dtype)

    return load_masked(directory, read_json_file(meta_path), inject, "losa")
