"""The base an adapter folder was trained on, recorded in ``adapter_method.json`` and checked on loading.

An adapter loaded on another base silently gives another model, so ``train.py`` records the base's model, pruning
and a zero-pattern fingerprint, and every loading path refuses another base in one line (no record: a warning).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from spp.errors import UserError
from spp.projections import DEFAULT_TARGETS, find_projections

log = logging.getLogger(__name__)

RECORD = "trained_on"
"""The key of ``adapter_method.json`` that holds the record (``{"model", "pruning", "masks"}``)."""


def zero_fingerprint(zeros: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """``{"sha256", "layers", "zeros", "total"}`` of exact-zero patterns by layer name.

    sha256 over each layer's name, shape and row-packed bits in sorted name order (independent of ranks and device).
    """
    digest = hashlib.sha256()
    n_zeros = total = 0
    for name in sorted(zeros):
        zero = zeros[name].detach().to("cpu", torch.bool).contiguous().numpy()
        digest.update(f"{name}:{tuple(zero.shape)};".encode())
        digest.update(memoryview(np.packbits(zero, axis=-1, bitorder="little")))  # = pack_rows, ~5x faster
        n_zeros, total = n_zeros + int(np.count_nonzero(zero)), total + zero.size
    return {"sha256": digest.hexdigest(), "layers": len(zeros), "zeros": n_zeros, "total": total}


def model_fingerprint(model: nn.Module, targets: list[str] | tuple[str, ...] = DEFAULT_TARGETS) -> dict[str, Any]:
    """:func:`zero_fingerprint` of the projections ``targets`` names (UserError if none match ``model``)."""
    layers = find_projections(model, list(targets), "pruner.targets")
    return zero_fingerprint({name: module.weight.detach() == 0 for name, module in layers.items()})


def describe_base(record: Mapping[str, Any]) -> str:
    """``tiny (tiny-1a2b3c4d5e6f7a8b, float32) pruned wanda nm2_4``: the base a record names, in a few words."""
    model = record.get("model") or {}
    pruning = record.get("pruning")
    how = f"pruned {pruning.get('pruner')} {pruning.get('sparsity')}" if pruning else "dense"
    if record.get("reconstruction"):
        how += " and reconstructed block by block"
    return f"{model.get('name')} ({model.get('identity')}, {model.get('dtype')}) {how}"


def recipe(record: Mapping[str, Any]) -> str:
    """``model=tiny pruner=wanda sparsity=nm2_4 ...``: the overrides that build the recorded base."""
    model, pruning = record.get("model") or {}, record.get("pruning")
    parts = [f"model={model.get('name')}"]
    if pruning:
        parts += [f"pruner={pruning.get('pruner')}", f"sparsity={pruning.get('sparsity')}"]
        calib = (pruning.get("key") or {}).get("calibration") or {}
        if calib.get("source"):
            parts.append(f"calibration={calib['source']}")
        parts += [f"calibration.{k}={'null' if calib[k] is None else calib[k]}"
                  for k in ("nsamples", "seqlen", "seed", "sampling") if k in calib]
    rec = ((record.get("reconstruction") or {}).get("key") or {}).get("reconstruct") or {}
    if rec:
        parts.append("reconstruct=blockwise")
        parts += [f"reconstruct.{k}={'null' if rec[k] is None else rec[k]}"
                  for k in ("form", "loss", "inputs", "source", "nsamples", "seqlen", "seed", "epochs", "batch_size",
                            "lr", "schedule", "dtype") if k in rec]
    return " ".join(parts)


def base_refusal(what: str, record: Mapping[str, Any], difference: str, key: str = "adapter_dir",
            path: Any = None) -> UserError:
    """The one-line refusal: ``what`` was trained on the recorded base, and how this base differs."""
    return UserError(f"{what} was trained on {describe_base(record)}, not on this base: {difference}",
                     f"load it on the base it was trained on ({recipe(record)}), or "
                     "evaluate that run's merged export (model.path=<run_dir>/merged)", key=key, path=path)


def check_base(record: Mapping[str, Any] | None, model: nn.Module, what: str, key: str = "adapter_dir",
               path: Any = None) -> None:
    """Refuse the plain pruned ``model`` when its zero pattern is not the one ``record`` fingerprinted.

    Without a record: warn and accept. UserError also when the recorded layers do not exist in ``model``.
    """
    masks = (record or {}).get("masks")
    if not masks:
        log.warning("%s records no base it was trained on (written before spp recorded it): loaded without checking "
                    "that this is the pruned model it was trained on", what)
        return
    if any(p.device.type == "meta" for p in model.parameters()):
        log.warning("%s: the base's weights are not in memory (meta device, offloaded): its zero pattern is not "
                    "checked against the recorded one", what)
        return
    try:
        here = model_fingerprint(model, tuple(masks.get("targets") or DEFAULT_TARGETS))
    except UserError as err:
        raise base_refusal(what, record, f"its pruned layers do not exist here ({err.what})", key, path) from err
    if here["sha256"] != masks["sha256"]:
        difference = (f"the zero pattern differs ({masks['zeros']:,} zeros of {masks['total']:,} weights in "
                      f"{masks['layers']} layers when trained, {here['zeros']:,} of {here['total']:,} in "
                      f"{here['layers']} here)")
        raise base_refusal(what, record, difference, key, path)
