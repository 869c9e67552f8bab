"""What pruning a model costs on N GPUs: host RAM per node, GPU memory per device and time, from the config alone.

Placement as in ``spp/pruning/engine.py``: rank 0 holds the weights in host memory; every rank onloads one block at a
time and runs 1/N of the calibration batches through it. Time is from FLOPs at :class:`Hardware`'s rates, plus
SparseGPT's per-column launch and sync cost (100 µs x 6.2 M columns ≈ 10 min for a 70B model): an estimate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from spp.planning.hardware import GIB, Hardware
from spp.planning.shapes import ModelShape
from spp.pruning.engine import sublayer_groups
from spp.pruning.registry import pruner_config
from spp.pruning.resolve import resolve_pruner


@dataclass(frozen=True)
class Calibration:
    """The calibration run: ``nsamples`` windows of ``seqlen`` tokens, ``batch_size`` windows per forward."""

    nsamples: int = 128
    seqlen: int = 2048
    batch_size: int = 8


def _hessian_bytes(shape: ModelShape, true_sequential: bool) -> int:
    """The X Xᵀ sums held at once (all linears, or the largest group of ``spp.pruning.engine.sublayer_groups``), as
    ``spp.pruning.statistics`` keeps them: exact int64 fixed-point sums (8 bytes an entry, one bucket per matrix in
    practice), plus one batch's fp32 Gram of the largest of them (scaled to integers in place, added a block of rows
    at a time)."""
    held = {name: i * i * 8 for name, (_o, i) in shape.linears.items()}
    batch = max(i * i * 4 for _o, i in shape.linears.values())
    return max(sum(held[name] for name in group) for group in sublayer_groups(held, true_sequential)) + batch


def _solve_bytes(shape: ModelShape) -> int:
    """SparseGPT's temporaries for the largest matrix: W and H⁻¹'s factor in fp32, block buffers, masks."""
    return max(o * i * 4 + 2 * i * i * 4 + 3 * o * 128 * 4 + o * i for o, i in shape.linears.values())


def uses_hessian(pruner: str) -> bool:
    """Whether pruner ``pruner`` (at its default settings) accumulates Hessians and solves them on owner ranks, as
    SparseGPT does: its memory and time are then counted as SparseGPT's, else as a cheap per-matrix rule's."""
    try:
        method = resolve_pruner(pruner_config(pruner))
    except ValueError:  # a plug-in not loaded here: counted as a cheap rule
        return False
    return method is not None and bool(method.uses_hessian)


def gpu_bytes(shape: ModelShape, world: int, cal: Calibration, hessian: bool, true_sequential: bool = False) -> int:
    """Peak GPU memory of one rank while it prunes (the largest of: a block being calibrated, the head)."""
    local_windows = -(-cal.nsamples // world)
    hidden = local_windows * cal.seqlen * shape.hidden * shape.bytes_per_param * 2  # inputs and outputs of a block
    batch = cal.batch_size * cal.seqlen
    activations = batch * ((3 * shape.intermediate + 4 * shape.hidden + 2 * shape.attention_width)
                           * shape.bytes_per_param + shape.score_bytes(cal.seqlen, shape.bytes_per_param))
    stats = _hessian_bytes(shape, true_sequential) if hessian else 0
    solve = _solve_bytes(shape) if hessian else max(o * i * 13 for o, i in shape.linears.values())
    block = shape.block_bytes + hidden + activations + stats + solve
    head = (shape.outside_params * shape.bytes_per_param + hidden
            + batch * shape.vocab * 4)  # the tail's logits of one batch (perplexity)
    return max(block, head)


def host_bytes_per_node(shape: ModelShape, world: int, hw: Hardware, cal: Calibration) -> dict[str, int]:
    """Host memory of the node holding rank 0: the weights once, the packed masks, one block in flight, the
    processes; and of any other node (no weights)."""
    rank0 = shape.weight_bytes + shape.pruned_params // 8 + shape.block_bytes + cal.nsamples * cal.seqlen * 8
    processes = min(world, hw.gpus_per_node) * hw.process_host_bytes
    return {"rank0_node": rank0 + processes, "other_nodes": processes, "weights": shape.weight_bytes,
            "masks": shape.pruned_params // 8}


def seconds(shape: ModelShape, world: int, hw: Hardware, cal: Calibration, hessian: bool,
            true_sequential: bool = False) -> dict[str, float]:
    """Estimated wall seconds of pruning on ``world`` GPUs, by part (see :class:`Hardware` for the rates)."""
    tokens = cal.nsamples * cal.seqlen
    groups = 4 if true_sequential else 1
    forward_flops = 2 * shape.block_params * tokens * (groups + 1) * shape.blocks
    attention_flops = 4 * cal.seqlen * shape.attention_width * tokens * (groups + 1) * shape.blocks
    out = {"load": shape.weight_bytes / (hw.disk_gbps * 1e9),
           "onload": shape.weight_bytes / (hw.h2d_gbps * 1e9)
           + (shape.weight_bytes / (hw.broadcast_gbps * 1e9) if world > 1 else 0.0),
           "forward": (forward_flops + attention_flops) / world / (hw.eval_tflops * 1e12)}
    if hessian:
        hessian_flops = sum(2 * tokens * i * i for _o, i in shape.linears.values()) * shape.blocks
        out["hessians"] = hessian_flops / world / (hw.prune_fp32_tflops * 1e12)
        solves = sorted((i * hw.column_overhead_s + (2 * o * i * 128 + 2 * i**3) / (hw.prune_fp32_tflops * 1e12)
                         for o, i in shape.linears.values()), reverse=True)
        per_rank = [sum(solves[r::world]) for r in range(min(world, len(solves)))]  # owners round robin
        out["solve"] = max(per_rank) * shape.blocks
        out["reduce_broadcast"] = (sum(i * i * 4 for _o, i in shape.linears.values()) + shape.block_bytes
                                   ) * shape.blocks / (hw.broadcast_gbps * 1e9) if world > 1 else 0.0
    else:
        out["solve"] = sum(o * i for o, i in shape.linears.values()) * shape.blocks * 20 / (hw.eval_tflops * 1e12)
    out["total"] = sum(out.values())
    return out


def plan(shape: ModelShape, world: int, pruner: str, hw: Hardware | None = None,
         cal: Calibration | None = None) -> dict[str, Any]:
    """The pruning plan of ``shape`` on ``world`` GPUs: memory per node and device, time, and the assumptions."""
    hw, cal = hw or Hardware(), cal or Calibration()
    hessian = uses_hessian(pruner)
    process_gpu = hw.process_device_bytes if hw.kind == "gpu" else 0
    gpu = gpu_bytes(shape, world, cal, hessian) + process_gpu
    stated = {"gpu_gib": hw.device_gib or 0.0, "gpus_per_node": hw.gpus_per_node, "bf16_tflops": hw.eval_tflops,
              "fp32_tflops": hw.prune_fp32_tflops, "column_overhead_s": hw.column_overhead_s,
              "h2d_gbps": hw.h2d_gbps, "broadcast_gbps": hw.broadcast_gbps, "disk_gbps": hw.disk_gbps,
              "process_host_gib": hw.process_host_bytes / GIB, "process_gpu_gib": process_gpu / GIB}
    return {"model": shape.name, "params": shape.params, "world": world, "pruner": pruner,
            "gpu_bytes_per_device": gpu, "gpu_fits": gpu <= stated["gpu_gib"] * GIB,
            "host_bytes": host_bytes_per_node(shape, world, hw, cal),
            "seconds": seconds(shape, world, hw, cal, hessian),
            "hardware": stated, "calibration": asdict(cal)}
