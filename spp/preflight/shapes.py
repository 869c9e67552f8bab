"""Shape rules checked on the model's arch fields before any weight is loaded: the adapter method's own, N:M's
``m | in_features``, the sequence lengths, and ``*.targets`` against one decoder block built on the meta device."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from spp.adapters.base import AdapterMethod
from spp.errors import UserError
from spp.planning.shapes import skeleton_from_arch
from spp.projections import block_projections, decoder_layers, matches, resolve_targets
from spp.pruning.resolve import prunes, resolve_adapter

log = logging.getLogger(__name__)


LLAMA_FIELDS = frozenset({"hidden_size", "intermediate_size", "num_attention_heads"})
"""The arch fields a LLaMA architecture needs (``model_type`` may then be absent)."""


@dataclass(frozen=True)
class ArchLayers:
    """The decoder block of an architecture on the meta device (GPT-2's ``Conv1D`` as ``nn.Linear``), its
    ``model_type`` (``kind``) and ``max_position_embeddings`` (``None``: no such limit)."""

    block: torch.nn.Module
    kind: str
    max_positions: int | None

    def shapes(self, targets: list[str], key: str) -> dict[str, tuple[int, int]]:
        """``(in_features, out_features)`` of the block projections ``targets`` names (resolved as training does),
        by in-block path."""
        names = resolve_targets(self.block, targets, key)
        return {p: (m.in_features, m.out_features) for p, m in block_projections(self.block).items()
                if matches(p, names)}


def arch_layers(arch: dict[str, Any]) -> ArchLayers | None:
    """The meta decoder block of ``arch`` (``model_type`` defaults to ``llama``); ``None`` when the fields are not
    enough or transformers cannot build it (checked at load time then)."""
    model_type = arch.get("model_type") or ("llama" if LLAMA_FIELDS <= set(arch) else None)
    if not model_type:
        return None
    try:
        import transformers

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # config warnings belong to load time, not to this check
        try:
            model = skeleton_from_arch({**arch, "model_type": model_type}, 1)
        finally:
            transformers.logging.set_verbosity(verbosity)
        _, layers = decoder_layers(model)
    except Exception as err:  # noqa: BLE001 - an architecture transformers cannot build fails at load time instead
        log.info("preflight: cannot build model_type=%s on the meta device (%s); layer checks run after loading",
                 model_type, err)
        return None
    return ArchLayers(layers[0], model_type, getattr(model.config, "max_position_embeddings", None))


def check_shapes(arch: dict[str, Any], *, adapter: Any = None, sparsity: Any = None, pruner: Any = None,
                 seqlens: dict[str, int] | None = None, method: AdapterMethod | None = None) -> None:
    """Every shape rule of the run against the arch: the sequence lengths within ``max_position_embeddings``, the
    adapter method's own (:meth:`~spp.adapters.base.AdapterMethod.preflight`, e.g. SPP's ``r | out_features``;
    ``method``: the resolved method of ``adapter``, else resolved here), every name of ``adapter.targets`` and
    ``pruner.targets`` matching a linear of the meta decoder block (the default list stands for all:
    :func:`spp.projections.resolve_targets`), N:M's ``m | in_features``."""
    if adapter is not None and method is None:
        method = resolve_adapter(adapter.name)
    layers = arch_layers(arch)
    max_pos = arch.get("max_position_embeddings") or (layers.max_positions if layers else None)
    for key, value in (seqlens or {}).items():
        if max_pos is not None and value > int(max_pos):
            raise UserError(f"{key}={value} exceeds the model's max_position_embeddings={max_pos}",
                            f"set {key}<={max_pos}", key=key)
    if layers is None:
        if adapter is not None:
            method.preflight(adapter, None)
        log.info("preflight: the model's shapes are unknown before loading (hub id without model.arch); "
                 "shape checks run after loading")
        return
    if adapter is not None:  # the method's own rules (SPP: r divides every out_features)
        method.preflight(adapter, layers.shapes(list(adapter.targets), "adapter.targets") if method.trains else None)
    if sparsity is None or pruner is None or not prunes(pruner, sparsity):
        return
    shapes = layers.shapes(list(pruner.targets), "pruner.targets")
    _n, m = sparsity.nm_pair
    if m is not None:
        bad = {p: inp for p, (inp, _out) in shapes.items() if inp % m}
        if bad:
            name, inp = next(iter(bad.items()))
            raise UserError(f"sparsity.m={m} does not divide in_features={inp} of {name} (N:M groups run along the "
                            "input dimension)", f"choose sparsity.m dividing {inp}, or drop {name} from "
                            "pruner.targets", key="sparsity.m")

