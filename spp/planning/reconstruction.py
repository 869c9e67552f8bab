"""The reconstruct phase of a run plan (``reconstruct=blockwise``): memory and time of block-wise reconstruction.

Placement as in ``spp.pruning.reconstruction.engine``: rank 0 keeps the pruned weights and the dense copy in host
memory; every rank onloads one block at a time and holds ``ceil(nsamples / world)`` hidden states of ``seqlen x
hidden`` in ``reconstruct.dtype``, plus per window the ``cos``/``sin`` position embeddings and int64 position ids.
Per block the peak is the largest of three moments:

* **dense**: the dense block builds the targets from the dense inputs (and, ``inputs=sparse``, the reconstructed
  prefix's outputs), plus one window's forward;
* **train**: the pruned block with its form trains one window at a time beside three sets of hidden states (two
  with ``inputs=dense``), the form's tensors, gradients (all-reduced in one flat buffer per dtype) and AdamW moments;
* **end**: the merged block's outputs are kept as the next inputs while the end loss is measured (a fourth set).

On CPU rank 0's onloaded block is its home tensor when ``reconstruct.dtype`` is the model's. Time: per block
``nsamples x seqlen`` tokens through ``3 x epochs + 3`` forwards (``spp.planning.flops``), at the bf16 or fp32 rate.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from spp.adapters.base import AdapterMethod
from spp.adapters.registry import apply_adapter
from spp.planning.hardware import Hardware
from spp.planning.memory import forward_bytes
from spp.planning.shapes import dtype_bytes, skeleton_from_arch
from spp.planning.spec import ReconstructSpec, RunSpec
from spp.projections import block_projections, decoder_layers
from spp.pruning.reconstruction.engine import form_config
from spp.pruning.reconstruction.one_block import OneBlock

RECONSTRUCT_HEAP_RETENTION = 0.25
"""On a CPU run glibc keeps freed heap memory resident (its mmap threshold rises to the largest freed block, so the
windows' hidden states and a window's transients come from the heap), which RSS counts: the run of
``benchmarks/plan_rss_reconstruct.py`` on 1 process peaked at 1613 and 1720 MiB (two runs) against 1422 MiB with
``MALLOC_MMAP_THRESHOLD_=131072`` (the live tensors; the plan without this term: 1466), 0.25-0.39 x its 768 MiB of
hidden states. Charged as this share of the hidden-state sets of the peak moment."""

HIDDEN_SETS = ("dense_inputs", "targets", "sparse_inputs", "block_outputs")
"""The sets of hidden states of :func:`moments`."""

LOSS_VALUES_PER_FEATURE = 2
"""The loss keeps ``out - target`` and its square in float32 per token and feature
(``spp.pruning.reconstruction.loss.window_losses``; a bf16 output and target are first widened: 2 more)."""


def form_tensors(arch: dict[str, Any], form: Any, dtype: str) -> dict[str, int]:
    """The form's tensors on one decoder block of ``arch``, counted by injecting adapter config ``form`` into a
    ``meta`` block in ``dtype`` (as the engine does to an onloaded block): trainable values and bytes (whole
    tensors), bytes the form adds (its parameters and buffers), the inputs whose dropped-out copy it keeps, and the
    largest adapted weight."""
    _prefix, layers = decoder_layers(skeleton_from_arch(arch, 1))
    block = layers[0].to(getattr(torch, dtype))
    before = {n: (m, tuple(m.parameters())) for n, m in block_projections(block).items()}
    size = sum(t.numel() * t.element_size() for t in [*block.parameters(), *block.buffers()])
    wrapper, _names = apply_adapter(OneBlock(block), form, {})
    trainable = [p for p in wrapper.parameters() if p.requires_grad]
    after = sum(t.numel() * t.element_size() for t in [*wrapper.parameters(), *wrapper.buffers()])
    now = block_projections(wrapper.get_submodule("layers.0"))
    adapted = [m for n, (m, params) in before.items()
               if now.get(n) is not m or any(p.requires_grad for p in params)]
    dropout = float(getattr(form, "dropout", 0.0) or 0.0)
    return {"trainable_params": sum(p.numel() for p in trainable),
            "trainable_bytes": sum(p.numel() * p.element_size() for p in trainable), "added_bytes": after - size,
            "dropout_inputs": sum(m.in_features for m in adapted) if dropout > 0 else 0,
            "largest_adapted": max((m.in_features * m.out_features for m in adapted), default=0)}


def reconstruct_spec(job: Any, arch: dict[str, Any], method: AdapterMethod | None) -> ReconstructSpec | None:
    """The :class:`ReconstructSpec` of ``job.reconstruct`` (``None`` for ``reconstruct=none``), read duck-typed;
    ``method``: the resolved form."""
    cfg = getattr(job, "reconstruct", None)
    if cfg is None or not cfg.enabled:
        return None
    tensors = form_tensors(arch, form_config(cfg, method), str(cfg.dtype))
    kept = method.forward_transient_values(tensors["largest_adapted"])
    return ReconstructSpec(form=str(cfg.form), nsamples=int(cfg.nsamples), seqlen=int(cfg.seqlen),
                           epochs=int(cfg.epochs), act_bytes=dtype_bytes(cfg.dtype),
                           sparse_inputs=str(getattr(cfg.inputs, "value", cfg.inputs)) == "sparse",
                           forward_transient_values=kept, **tensors)


def _per_window(spec: RunSpec, rc: ReconstructSpec) -> dict[str, int]:
    """What one window costs on the device: its call arguments (kept for every window) and the activations of
    one forward without gradients and of one forward and backward through the formed block (autograd's saved
    tensors of ``spp.planning.memory.block_activation_bytes``, the form's dropped-out inputs, the loss)."""
    shape = spec.shape
    a, s, h, q, i = rc.act_bytes, rc.seqlen, shape.hidden, shape.attention_width, shape.intermediate
    head_dim = q // shape.heads if shape.heads else h
    loss = s * h * 4 * (LOSS_VALUES_PER_FEATURE + (2 if a < 4 else 0))
    kept = (4 * shape.norms_per_block * h + a * (2 * h + 5 * q) + 4 * a * i + shape.score_bytes(s, a)
            + rc.dropout_inputs * (a + 1))
    kept_for_backward = rc.forward_transient_values * a  # the form's own (SPP: its merged weight)
    return {"call_arguments": 2 * s * head_dim * shape.bytes_per_param + 8 * s,
            "forward": forward_bytes(replace(spec, act_bytes=a), 1, s)["block"] + loss,  # one window, no grad
            "train_window": s * kept + loss + kept_for_backward}


def moments(spec: RunSpec, rc: ReconstructSpec, rank0_cpu: bool = False) -> dict[str, dict[str, int]]:
    """The device terms of one rank at each moment of a block (module docstring): ``dense``, ``train``, ``end``.
    ``rank0_cpu``: global rank 0 of a CPU run, whose onloaded block is its home when the dtypes agree."""
    shape, world = spec.shape, spec.world
    windows = -(-rc.nsamples // world)
    one_set = windows * rc.seqlen * shape.hidden * rc.act_bytes  # this rank's hidden states, in reconstruct.dtype
    aliased = rank0_cpu and rc.act_bytes == shape.bytes_per_param
    block = 0 if aliased else shape.block_params * rc.act_bytes
    win = _per_window(spec, rc)
    base = {"dense_inputs": one_set, "targets": one_set, "call_arguments": windows * win["call_arguments"]}
    if rc.sparse_inputs:
        base["sparse_inputs"] = one_set
    form = {"form": rc.added_bytes, "form_gradients": rc.trainable_bytes, "adamw_moments": 2 * rc.trainable_bytes}
    # a window's forward and backward, or after it the flat buffer the gradients are summed in over the ranks
    # (spp.pruning.reconstruction.train_block): not alive at once
    summed = rc.trainable_bytes if world > 1 else 0
    step = {"window_activations": win["train_window"]} if win["train_window"] >= summed else {"gradient_sum": summed}
    kept = {"form": rc.added_bytes, "form_gradients": rc.trainable_bytes}  # until the block's step returns
    out = {"dense": {"dense_block": block, **base, "window_forward": win["forward"]},
           "train": {"block": block, **base, **form, **step},
           "end": {"block": block, **base, **kept, "block_outputs": one_set, "window_forward": win["forward"]}}
    return {name: {k: int(v) for k, v in terms.items() if v} for name, terms in out.items()}


def device_terms(spec: RunSpec, rc: ReconstructSpec, hw: Hardware, rank0_cpu: bool = False) -> dict[str, int]:
    """The terms of the largest moment (:func:`moments`), with the CUDA context on a GPU and glibc's retained
    heap on a CPU (:data:`RECONSTRUCT_HEAP_RETENTION`)."""
    peak = max(moments(spec, rc, rank0_cpu).values(), key=lambda terms: sum(terms.values()))
    if spec.kind == "gpu":
        return {**peak, "cuda_context": hw.process_device_bytes}
    hidden = sum(v for k, v in peak.items() if k in HIDDEN_SETS)
    return {**peak, "heap_retention": int(RECONSTRUCT_HEAP_RETENTION * hidden)}


def host_terms(spec: RunSpec, rc: ReconstructSpec) -> dict[str, int]:
    """Global rank 0's host terms beside its process: the pruned weights (home), the dense copy (taken before
    pruning), the packed masks, the drawn windows' ids and one block handed to the cache writer."""
    shape = spec.shape
    return {"weights": shape.weight_bytes, "dense_copy": shape.weight_bytes,
            "masks": shape.pruned_params // 8 if spec.prunes else 0, "calibration_ids": rc.nsamples * rc.seqlen * 8,
            "cache_writer": shape.block_bytes if spec.prunes else 0}


def seconds(spec: RunSpec, rc: ReconstructSpec, hw: Hardware) -> dict[str, float]:
    """Estimated wall seconds (module docstring): the blocks' FLOPs over the ranks, moving the blocks between host
    and device (dense and pruned onloaded, the pruned one written back) and writing the cache entry."""
    shape = spec.shape
    forward = 2 * sum(o * i for o, i in shape.block_linears.values()) + 2 * rc.seqlen * shape.attention_width
    passes = 3 * rc.epochs + 3
    flops = shape.blocks * rc.nsamples * rc.seqlen * forward * passes / spec.world
    rate = hw.train_tflops if rc.act_bytes == 2 or spec.kind == "cpu" else hw.prune_fp32_tflops
    out = {"train": flops / (rate * 1e12)}
    if spec.kind == "gpu":
        out["onload"] = 3 * shape.blocks * shape.block_bytes / (hw.h2d_gbps * 1e9)
    if spec.prunes:
        out["cache_write"] = shape.blocks * shape.block_bytes / (hw.disk_gbps * 1e9)
    return out


def phase_parts(spec: RunSpec, rc: ReconstructSpec, hw: Hardware) -> tuple[
        str, dict[str, int], dict[str, int], dict[str, int], int, dict[str, int], dict[str, float]]:
    """``(where, device, rank0, rank, processes per node, disk, seconds)`` of the reconstruct phase."""
    process = {"process": hw.process_host_bytes}
    host = {k: v for k, v in host_terms(spec, rc).items() if v}
    if spec.kind == "cpu":  # the device terms are each process's own memory
        device, rank0 = {}, {**process, **host, **device_terms(spec, rc, hw, rank0_cpu=True)}
        rank = {**process, **device_terms(spec, rc, hw)}
    else:
        device, rank0, rank = device_terms(spec, rc, hw), {**process, **host}, dict(process)
    disk = {"cache_entry": spec.shape.blocks * spec.shape.block_bytes + spec.shape.pruned_params // 8} \
        if spec.prunes else {}
    return (f"{spec.kind.upper()}, a block at a time", device, rank0, rank, spec.devices, disk, seconds(spec, rc, hw))
