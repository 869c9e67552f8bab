"""LoSA's layers: SparsePEFT's masked LoRA layer (``W~ + s·(B A) ⊙ M``, every pruned zero kept in training and
merge) with the rank of each decoder block's layers set by :func:`~spp.adapters.methods.losa.allocation.allocate_ranks`
(peft's ``rank_pattern``) and one scaling ``s = lora_alpha / r`` for all (peft's ``alpha_pattern``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

from spp.adapters.methods.sparse_lora.layer import SparseLoraLinear, sparse_lora_layers
from spp.bitmask import checked_mask
from spp.projections import decoder_layers, find_projections


def layer_ranks(model: nn.Module, names: Sequence[str], ranks: Sequence[int]) -> dict[str, int]:
    """``{layer name: its block's rank}`` for the adapted ``names`` (``ranks``: one per decoder block).

    Raises:
        ValueError: ``ranks`` does not have one entry per decoder block, or a layer outside the blocks.
    """
    prefix, layers = decoder_layers(model)
    if len(ranks) != len(layers):
        raise ValueError(f"adapter.block_errors has {len(ranks)} entries but the model has {len(layers)} decoder "
                         "blocks; measure one error per block of this model")
    found = {}
    for name in names:
        match = re.match(rf"{re.escape(prefix)}\.(\d+)\.", name)
        if match is None:
            raise ValueError(f"losa: adapted layer {name!r} is outside the decoder blocks; narrow adapter.targets")
        found[name] = int(ranks[int(match.group(1))])
    return found


def inject_losa(model: nn.Module, masks: Mapping[str, torch.Tensor] | None, targets: Sequence[str],
                ranks: Sequence[int], r: int, alpha: float, dropout: float,
                dtype: torch.dtype = torch.float32) -> PeftModel:
    """Wrap ``model`` with masked LoRA layers of their block's rank (peft init: ``B = 0``, output unchanged); only
    ``A``/``B`` train. ``masks`` (True = kept) must cover every adapted layer; ``None``/empty: the non-zeros."""
    names = list(find_projections(model, targets, "adapter.targets"))
    per_layer = layer_ranks(model, names, ranks)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=names, bias="none",
                        task_type="CAUSAL_LM", rank_pattern={re.escape(n): k for n, k in per_layer.items()},
                        alpha_pattern={re.escape(n): alpha * k / r for n, k in per_layer.items()})
    config._register_custom_module({nn.Linear: SparseLoraLinear})
    peft_model = get_peft_model(model, config)
    layers = dict(sparse_lora_layers(peft_model))
    if masks:
        missing = sorted(set(layers) - set(masks))
        if missing:
            raise ValueError(f"losa: no pruning mask for {len(missing)} adapted layer(s), e.g. {missing[:3]}; "
                             "prune the layers that adapter.targets names")
        for name, layer in layers.items():
            layer.set_mask(checked_mask(name, masks[name], layer.get_base_layer().weight))
    for layer in layers.values():
        for module in (*layer.lora_A.values(), *layer.lora_B.values()):
            module.to(dtype=dtype)
    return peft_model
