"""The adapter's part of a run plan, asked of its method, so a plug-in method (``norms``) is planned as it trains.

``inject`` runs on ``meta`` skeletons of one and two blocks: what the second block makes trainable is what every
further block adds; the rest is counted once. The method states its FLOPs and transient bytes itself.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from spp.adapters.base import AdapterMethod
from spp.adapters.registry import apply_adapter
from spp.planning.shapes import ModelShape, skeleton_from_arch
from spp.planning.spec import AdapterSpec
from spp.pruning.resolve import resolve_adapter

MODEL_DTYPES = ("float32", "float64")
"""``model.torch_dtype`` values the skeleton is built in; any other is planned in bfloat16 (2 bytes a value)."""


def adapter_spec(cfg: Any, arch: dict[str, Any], shape: ModelShape, model_dtype: str,
                 method: AdapterMethod | None = None) -> AdapterSpec:
    """The :class:`AdapterSpec` of ``job.adapter`` on the model ``arch`` (``method``: resolved here when not given).
    Raises ``UserError`` for an unknown method, ``ValueError`` for targets that match no layer."""
    method = method if method is not None else resolve_adapter(cfg.name)
    dropout = float(getattr(cfg, "dropout", 0.0) or 0.0)
    spec = AdapterSpec(name=str(cfg.name), trains=bool(method.trains), targets=tuple(cfg.targets), dropout=dropout,
                       keeps_weight=method.keeps_merged_weights(cfg))
    if not method.trains:
        return spec
    one, two = (trainable_tensors(cfg, arch, blocks, model_dtype) for blocks in (1, 2))
    counts = {k: one[k] + (shape.blocks - 1) * (two[k] - one[k]) for k in one}
    adapted = spec.adapted_weights(shape)
    largest = max((o * i for o, i in spec.dims(shape)), default=0)
    return replace(spec, **counts, flops=int(method.train_flops(adapted, counts["trainable"], dropout)),
                   resident=tuple(method.resident_terms(adapted).items()),
                   forward_transient_values=method.forward_transient_values(largest),
                   backward_transient_bytes=method.backward_transient_bytes(largest))


def trainable_tensors(cfg: Any, arch: dict[str, Any], blocks: int, model_dtype: str) -> dict[str, int]:
    """What the method's ``inject`` makes trainable on the ``meta`` skeleton of ``arch`` with ``blocks`` decoder
    blocks: values, bytes, and bytes of the tensors it added (not parameters of the skeleton before)."""
    dtype = getattr(torch, model_dtype) if model_dtype in MODEL_DTYPES else torch.bfloat16
    model = skeleton_from_arch(arch, blocks).to(dtype)
    before = list(model.parameters())  # held, so that no new tensor takes the id of a freed one
    own = {id(p) for p in before}
    model, _names = apply_adapter(model, cfg, {})
    trainable = [p for p in model.parameters() if p.requires_grad]
    return {"trainable": sum(p.numel() for p in trainable),
            "trainable_bytes": sum(p.numel() * p.element_size() for p in trainable),
            "added_bytes": sum(p.numel() * p.element_size() for p in trainable if id(p) not in own)}
