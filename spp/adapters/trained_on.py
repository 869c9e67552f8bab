"""The base an adapter folder was trained on, recorded in its ``adapter_method.json`` and checked on loading.

An adapter holds only the trained tensors: loaded on another base (another model, or the same one pruned with other
settings or calibration) it gives another model, with no error. ``train.py`` therefore records, under
:data:`RECORD`, the base's model (``name``, :func:`spp.models.loading.model_identity`, dtype), its pruning (pruner,
sparsity, the pruning cache key) and a fingerprint of its zero pattern (:func:`zero_fingerprint`: sha256 over the
exact-zero bits of the pruned projections, in name order). Every loading path compares the fingerprint with the
base it is given (:func:`check_base`: ``eval.py adapter_dir=``, :func:`spp.adapters.registry.load_adapter_dir`,
``spp.peft``'s ``PeftModel.from_pretrained``) and refuses another base in one line; a folder written before the
record existed loads with a warning. This module reads weights only (no pruning code: ``spp.pruning`` imports
``spp.adapters``); the record itself is built by ``spp.training.finalize.provenance``.
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
    """``{"sha256", "layers", "zeros", "total"}`` of exact-zero patterns (True = zero) by layer name: sha256 over
    each layer's name, shape and row-packed bits, layers in sorted name order (independent of the ranks, the
    device and the order the layers were pruned in)."""
    digest = hashlib.sha256()
    n_zeros = total = 0
    for name in sorted(zeros):
        zero = zeros[name].detach().to("cpu", torch.bool).contiguous().numpy()
        digest.update(f"{name}:{tuple(zero.shape)};".encode())
        digest.update(memoryview(np.packbits(zero, axis=-1, bitorder="little")))  # = pack_rows, ~5x faster
        n_zeros, total = n_zeros + int(np.count_nonzero(zero)), total + zero.size
    return {"sha256": digest.hexdigest(), "layers": len(zeros), "zeros": n_zeros, "total": total}


def model_fingerprint(model: nn.Module, targets: list[str] | tuple[str, ...] = DEFAULT_TARGETS) -> dict[str, Any]:
    """:func:`zero_fingerprint` of the projections ``targets`` names (the pruner's targets) of a plain model (or one
    whose adapted layers read their base weight through ``.weight``).

    Raises:
        UserError: ``targets`` matches no projection of ``model`` (another architecture).
    """
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
    """``model=tiny pruner=wanda sparsity=nm2_4 calibration=c4 calibration.nsamples=4 ...``: the overrides that
    build the recorded base."""
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


def warn_unrecorded(what: str) -> None:
    """One warning line for a folder written before adapters recorded their base."""
    log.warning("%s records no base it was trained on (written before spp recorded it): loaded without checking that "
                "this is the pruned model it was trained on", what)


def check_base(record: Mapping[str, Any] | None, model: nn.Module, what: str, key: str = "adapter_dir",
               path: Any = None) -> None:
    """Refuse ``model`` (the plain pruned base, before the adapter is loaded) when its zero pattern is not the one
    ``record`` fingerprinted; warn (and accept) when there is no record.

    Raises:
        UserError: another zero pattern, or the recorded layers do not exist in ``model``.
    """
    masks = (record or {}).get("masks")
    if not masks:
        warn_unrecorded(what)
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
