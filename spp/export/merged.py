"""The merged sparse model, written block by block: never merged whole, never whole on one device.

Rank ``i mod N`` merges, audits and writes block ``i`` as a shard; rank 0 writes the rest; renamed when complete."""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from spp.adapters.base import WRAPPER_PREFIX, AdapterMethod
from spp.atomic import follow_umask, human_bytes, is_disk_full, publish
from spp.bitmask import unpack_rows
from spp.distributed import DistContext
from spp.errors import UserError
from spp.export.manifest import ExportManifest
from spp.gathering import gatherer_for
from spp.models.conv1d import conv1d_layout, conv1d_weights
from spp.projections import decoder_layers
from spp.pruning.masks import ZeroPattern
from spp.pruning.zero_audit import SparsityViolation, audit_summary, check_layer_zeros

SHARD_NAME = "model-{:05d}-of-{:05d}.safetensors"
INDEX_NAME = "model.safetensors.index.json"
AUDIT_COUNTS = 5  # layers, zeros, total, kept zeros filled, kept weights zeroed (see _audit)
EXPORT_SLACK_BYTES = 32 * 2**20
"""Room an export needs beyond its tensors (tokenizer and JSON files), on top of 1 % of the tensors' bytes."""


@dataclass
class ExportInputs:
    """What the export needs besides the model.

    ``zeros`` (masks + kept zeros) is on rank 0 only. ``overrides`` are values merged instead of the module's own, by
    parameter name (DeepSpeed's fp32 masters, whose module copies ``bf16-mixed`` rounded)."""

    method: AdapterMethod
    zeros: ZeroPattern | None
    tokenizer: Any
    manifest: ExportManifest
    overrides: Mapping[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class ExportResult:
    """The published folder, the zero audit of its weights, the seconds it took, how it was written (its shards and
    writers) and what the merge reports (the method's :meth:`~spp.adapters.base.AdapterMethod.merge_summary`)."""

    path: Path
    audit: dict[str, Any]
    seconds: float
    layout: dict[str, Any]
    merge: dict[str, Any]


def hf_model(model: nn.Module) -> nn.Module:
    """The plain Hugging Face model inside an adapter wrapper (peft's ``PeftModel``), or ``model`` itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def plain_name(name: str) -> str:
    """``name`` without the adapter wrapper's prefix (``base_model.model.model.layers.0`` -> ``model.layers.0``)."""
    return name.removeprefix(WRAPPER_PREFIX)


def _tensors(module: nn.Module, prefix: str, skip: list[str],
             overrides: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """``module``'s parameters and persistent buffers by plain name, except inside ``skip``; ``overrides`` replace
    values in their own dtype (``adapter=norms``' trained norm weights)."""
    out: dict[str, torch.Tensor] = {}
    overrides = overrides or {}
    items = list(module.named_parameters()) + [
        (n, b) for n, b in module.named_buffers()
        if n.rsplit(".", 1)[-1] not in module.get_submodule(n.rpartition(".")[0])._non_persistent_buffers_set]
    for name, tensor in items:
        if any(name.startswith(s + ".") for s in skip):
            continue
        full = f"{prefix}.{name}" if prefix else name
        value = overrides[full].to(tensor.dtype) if full in overrides else tensor
        out[plain_name(full)] = value.detach()
    return out


def _overridden(module: nn.Module, name: str, overrides: Mapping[str, torch.Tensor]) -> nn.Module:
    """``module`` itself, or a copy whose parameters named in ``overrides`` (full names: ``name.<param>``) hold
    those values."""
    if not any(f"{name}.{n}" in overrides for n, _ in module.named_parameters()):
        return module
    layer = copy.deepcopy(module)
    for n, param in layer.named_parameters():
        if f"{name}.{n}" in overrides:
            param.data = overrides[f"{name}.{n}"].to(param.device)
    return layer


def merged_block_tensors(block: nn.Module, prefix: str, method: AdapterMethod, masks: Mapping[str, torch.Tensor],
                         overrides: Mapping[str, torch.Tensor] | None = None
                         ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """The plain tensors of one whole decoder block as the merged model holds them, and each adapted layer's merge
    report; adapted layers are merged by ``method.merged_layer``, other tensors taken as they are."""
    out: dict[str, torch.Tensor] = {}
    stats: dict[str, dict[str, Any]] = {}
    adapted: list[str] = []
    for name, module in block.named_modules():
        if not name or any(name.startswith(a + ".") for a in adapted):
            continue
        qualified = plain_name(f"{prefix}.{name}")
        merged = method.merged_layer(_overridden(module, f"{prefix}.{name}", overrides or {}), masks.get(qualified))
        if merged is not None:
            adapted.append(name)
            out.update({f"{qualified}.{k}": v for k, v in merged.tensors.items()})
            stats[qualified] = merged.stats
    out.update(_tensors(block, prefix, adapted, overrides))
    return {k: v.to("cpu", copy=True).contiguous() for k, v in out.items()}, stats


def _zero_refs(ctx: DistContext, zeros: ZeroPattern | None, block: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{layer: (keep-mask, expected zeros)}`` of the layers of ``block`` (plain prefix), sent by rank 0."""
    payload = None
    if ctx.is_main and zeros is not None:
        masks = zeros.masks
        payload = {n: (masks.packed(n), masks.shape(n)[1], zeros.kept_zeros.get(n)) for n in masks
                   if n.startswith(block + ".")}
    payload = ctx.broadcast_object(payload)
    refs = {}
    for name, (packed, cols, kept) in (payload or {}).items():
        mask = unpack_rows(packed, cols)
        expected = ~mask
        if kept is not None:
            expected.view(-1)[kept] = True
        refs[name] = (mask, expected)
    return refs


def _audit(tensors: dict[str, torch.Tensor], refs: dict[str, tuple[torch.Tensor, torch.Tensor]],
           kept_may_change: bool) -> list[int]:
    """``[layers, zeros, total, kept zeros filled, kept weights zeroed]`` of one block's merged weights (raises on a
    violation)."""
    counts = [0] * AUDIT_COUNTS
    for name, (mask, expected) in refs.items():
        weight = tensors.get(f"{name}.weight")
        if weight is None:
            raise SparsityViolation(f"[export] {name}: a pruned layer is missing from the merged block")
        layer = check_layer_zeros(name, weight, mask, expected, kept_may_change, "export")
        counts = [a + b for a, b in zip(counts, (1, *layer[:2], *layer[2:]), strict=True)]
    return counts


def _write_shard(directory: Path, index: int, count: int, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One shard file; returns its weight map, bytes and parameter count."""
    name = SHARD_NAME.format(index, count)
    save_file(tensors, str(directory / name), metadata={"format": "pt"})
    return {"weight_map": dict.fromkeys(tensors, name),
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "params": sum(t.numel() for t in tensors.values())}


class _Writer:
    """What one rank wrote (weight map, bytes, parameters, audit counts) and the first error it met."""

    def __init__(self) -> None:
        self.weight_map: dict[str, str] = {}
        self.bytes = self.params = 0
        self.audit = [0] * AUDIT_COUNTS
        self.merge: dict[str, dict[str, Any]] = {}
        self.error: Exception | None = None

    def add(self, written: dict[str, Any], counts: list[int]) -> None:
        self.weight_map.update(written["weight_map"])
        self.bytes += written["bytes"]
        self.params += written["params"]
        self.audit = [a + b for a, b in zip(self.audit, counts, strict=True)]

    def record(self, path: Path) -> dict[str, Any]:
        return {"weight_map": self.weight_map, "bytes": self.bytes, "params": self.params, "audit": self.audit,
                "merge": self.merge, "error": None if self.error is None else _portable(self.error, path)}


def _portable(err: Exception, path: Path) -> Exception:
    """An error every rank can unpickle and raise: a full disk as its one line, the project's own errors as they
    are, anything else as a RuntimeError with its text."""
    if is_disk_full(err):
        return _disk_full(err, path)
    return err if isinstance(err, (UserError, SparsityViolation)) else RuntimeError(f"{type(err).__name__}: {err}")


def needed_bytes(model: nn.Module) -> int:
    """About what the export writes: the model's tensors (adapter tensors included: a slight overestimate)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied tensor counts once
    return total * 101 // 100 + EXPORT_SLACK_BYTES


def remove_stale_export(path: Path) -> None:
    """Remove a previous run's export at ``path``: it belongs to other weights and would otherwise load as this run's
    when this export fails (a full disk)."""
    if path.is_dir() and not path.is_symlink():
        logging.getLogger(__name__).info("removing the previous export %s: this run's export replaces it", path)
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _begin(path: Path, needed: int) -> Path:
    """Rank 0's start: remove a stale export at ``path``, check the free space and make the temporary folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_export(path)
    free = shutil.disk_usage(path.parent).free
    if free < needed:
        raise UserError(f"not enough disk space to export the merged model to {path}: it needs about "
                        f"{human_bytes(needed)}, {human_bytes(free)} free there; nothing was written",
                        "free space there, or give this run another run_dir= on a disk with room, or set "
                        "export.merged=false", key="export.merged", path=path)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    return tmp


def _write_blocks(model: nn.Module, inputs: ExportInputs, tmp: Path, ctx: DistContext, writer: _Writer) -> int:
    """Every block through :func:`merged_block_tensors` on its writing rank; returns the number of shards."""
    prefix, layers = decoder_layers(model)
    count = len(layers) + 1
    gather = gatherer_for(model)
    transposed = {plain_name(n) for n in conv1d_weights(model)}  # GPT-2's Conv1D: written [in, out] again
    for i, block in enumerate(layers):
        refs = _zero_refs(ctx, inputs.zeros, plain_name(f"{prefix}.{i}"))
        with gather.gathered(block):
            if ctx.owner(i) != ctx.rank or writer.error is not None:
                continue
            try:
                masks = {k: m for k, (m, _e) in refs.items()}
                tensors, stats = merged_block_tensors(block, f"{prefix}.{i}", inputs.method, masks, inputs.overrides)
                counts = _audit(tensors, refs, inputs.method.kept_zeros_may_change)
                writer.add(_write_shard(tmp, i + 1, count, conv1d_layout(tensors, transposed)), counts)
                writer.merge.update(stats)
                del tensors
            except Exception as err:  # noqa: BLE001 - every rank must learn of it, not wait at the next collective
                writer.error = err
    with gather.gathered(model):
        if ctx.is_main and writer.error is None:
            try:
                rest = _tensors(model, "", [prefix], inputs.overrides)
                outside = {k: v.to("cpu", copy=True).contiguous() for k, v in rest.items()}
                writer.add(_write_shard(tmp, count, count, conv1d_layout(outside, transposed)), [0] * AUDIT_COUNTS)
            except Exception as err:  # noqa: BLE001 - every rank must learn of it, not wait at the next collective
                writer.error = err
    return count


def _in_model_order(records: list[dict[str, Any]], prefix: str) -> dict[str, dict[str, Any]]:
    """Every rank's per-layer merge reports in model order (block, then the layer's place in its block)."""
    rows = [(int(name[len(prefix) + 1:].split(".")[0]), k, name, stats)
            for rec in records for k, (name, stats) in enumerate(rec["merge"].items())]
    return {name: stats for _b, _k, name, stats in sorted(rows, key=lambda row: row[:2])}


def _finish(model: nn.Module, inputs: ExportInputs, tmp: Path, path: Path, records: list[dict[str, Any]],
            count: int) -> dict[str, Any]:
    """Rank 0: the index, config, generation config, tokenizer and ``spp_export.json``; then publish ``tmp``."""
    weight_map = {k: v for rec in records for k, v in rec["weight_map"].items()}
    audit = audit_summary(*(sum(rec["audit"][k] for rec in records) for k in range(AUDIT_COUNTS)))
    index = {"metadata": {"total_parameters": sum(r["params"] for r in records),
                          "total_size": sum(r["bytes"] for r in records)},
             "weight_map": dict(sorted(weight_map.items()))}
    (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    hf = hf_model(model)
    config = copy.deepcopy(hf.config)
    config.dtype = str(inputs.manifest.torch_dtype()).removeprefix("torch.")
    config.save_pretrained(tmp)
    if getattr(hf, "generation_config", None) is not None and hf.can_generate():
        hf.generation_config.save_pretrained(tmp)
    if inputs.tokenizer is not None:
        inputs.tokenizer.save_pretrained(tmp)
    layout = {"shards": count, "writers": len(records), "per_block": True}
    merge = inputs.method.merge_summary(_in_model_order(records, plain_name(decoder_layers(model)[0])))
    replace(inputs.manifest, audit=audit, layout=layout).write(tmp)
    follow_umask(tmp)
    if path.exists():
        shutil.rmtree(path)
    publish(tmp, path, directory=True)
    return {"audit": audit, "layout": layout, "merge": merge}


def export_streamed(model: nn.Module, inputs: ExportInputs, path: str | Path, ctx: DistContext) -> ExportResult:
    """Write the merged model of ``model`` to ``path`` block by block; every rank calls it and gets the same result.

    Too little disk, a full disk (``UserError``) or a revived pruned weight (``SparsityViolation``) fail on every
    rank with nothing kept."""
    start = time.perf_counter()
    path = Path(path)
    inputs.manifest.torch_dtype()  # config.json's dtype must name one before anything is written
    tmp = ctx.on_main(lambda: _begin(path, needed_bytes(model)), UserError)  # every rank gets its name
    writer = _Writer()
    count = _write_blocks(model, inputs, tmp, ctx, writer)
    records = ctx.gather_objects(writer.record(path))
    outcome: Any = next((r["error"] for r in records if r["error"] is not None), None)
    if ctx.is_main:
        if outcome is None:
            try:
                outcome = _finish(model, inputs, tmp, path, records, count)
            except Exception as err:  # noqa: BLE001 - every rank must learn of it
                outcome = _portable(err, path)
        if not isinstance(outcome, dict):
            shutil.rmtree(tmp, ignore_errors=True)
    outcome = ctx.broadcast_object(outcome)
    if isinstance(outcome, Exception):
        raise outcome
    return ExportResult(path, outcome["audit"], round(time.perf_counter() - start, 2), outcome["layout"],
                        outcome["merge"])


def _disk_full(err: Exception, path: Path) -> UserError:
    free = shutil.disk_usage(path.parent).free if path.parent.exists() else 0
    return UserError(f"the disk filled up while exporting the merged model to {path} ({human_bytes(free)} free now; "
                     f"{type(err).__name__}: {err}); nothing half-written was kept", "free space there, or give this "
                     "run another run_dir= on a disk with room, or set export.merged=false", key="export.merged",
                     path=path)
