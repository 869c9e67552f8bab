"""The run plan as a readable table (``train.py plan=true``) and as JSON."""

from __future__ import annotations

from typing import Any

from spp.planning.check import as_dicts, describe, problems
from spp.planning.hardware import GIB
from spp.planning.memory import activation_choices
from spp.planning.run import RunPlan

COLUMNS = ("phase", "where", "GPU GiB/device", "host GiB rank 0", "host GiB other rank", "host GiB rank-0 node",
           "host GiB other node", "disk GiB", "time")


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def time_text(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:.0f} days"


def rows(plan: RunPlan) -> list[tuple[str, ...]]:
    """One row per phase (:data:`COLUMNS`)."""
    out = []
    for p in plan.phases:
        gpu = _gib(p.device_bytes) if p.device else "-"
        other = _gib(p.host_other_node) if plan.spec.nodes > 1 and p.host_other_node else "-"
        disk = _gib(sum(p.disk.values())) if p.disk else "-"
        rank = _gib(sum(p.rank.values())) if p.rank and plan.spec.world > 1 else "-"
        out.append((p.name, p.where, gpu, _gib(sum(p.rank0.values())), rank, _gib(p.host_rank0_node), other, disk,
                    time_text(sum(p.seconds.values()))))
    return out


def table(header: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
    """Aligned text columns (left: first two, right: the numbers)."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(r: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in body)]


def text(plan: RunPlan, sources: dict[str, str] | None = None) -> str:
    """The plan as printed by ``plan=true``: the job, the machine, one row per phase, placement, peaks, fit."""
    s, sources = plan.spec, sources or {}
    lines = [f"plan: {s.shape.name} ({s.shape.params / 1e9:.2f} B parameters, weights {_gib(s.shape.weight_bytes)} "
             f"GiB), {s.strategy_label} on {s.devices} {'GPU' if s.kind == 'gpu' else 'CPU process'}(s) x {s.nodes} "
             f"node(s); adapter {s.adapter.name} ({s.adapter.trainable / 1e6:.1f} M trainable); pruner {s.pruner}",
             _machine(plan, sources), "", *table(COLUMNS, rows(plan)), ""]
    if s.adapter.trains:
        with_ckpt, without = activation_choices(s)
        lines.append(f"training activations per micro-batch ({s.train.micro_batch} x {s.train.seqlen} tokens): "
                     f"{_gib(with_ckpt)} GiB with activation checkpointing, {_gib(without)} GiB without (this job: "
                     f"{'with' if s.train.checkpointing else 'without'})")
    if s.reconstruct is not None:
        rc = s.reconstruct
        lines.append(f"reconstruction: form {rc.form} ({rc.trainable_params / 1e6:.2f} M trainable per block), "
                     f"{rc.nsamples} x {rc.seqlen}-token windows, {rc.epochs} epoch(s), "
                     f"{'bfloat16' if rc.act_bytes == 2 else 'float32'}, inputs from the "
                     f"{'reconstructed' if rc.sparse_inputs else 'dense'} prefix")
    if any(p.name == "evaluate" for p in plan.phases):
        lines.append(f"evaluation: {plan.placement.how}: {plan.placement.reason}")
    peak_phase = max(plan.phases, key=lambda p: p.host_rank0_node).name
    lines.append(f"peak: {_gib(plan.peak_device_bytes)} GiB per GPU, {_gib(plan.peak_host_node_bytes)} GiB host on "
                 f"global rank 0's node ({peak_phase}); per process {_gib(plan.peak_process_bytes(True))} GiB "
                 f"(rank 0), {_gib(plan.peak_process_bytes(False))} GiB (any other)")
    lines.append(f"estimated time: {time_text(plan.seconds)} (FLOPs at the stated throughput: an estimate)")
    found = problems(plan)
    lines += describe(found) or ["fits: every phase within the stated memory"]
    return "\n".join(lines) + "\n"


def _machine(plan: RunPlan, sources: dict[str, str]) -> str:
    hw = plan.hardware
    if plan.spec.kind == "cpu":
        gpu = "CPU run (device terms are host memory)"
    elif hw.device_bytes:
        gpu = f"GPU of {hw.device_gib:.0f} GiB ({sources.get('GPU', 'assumed')})"
    else:
        gpu = "GPU memory unknown (not checked)"
    host = f"host {hw.host_gib:.0f} GiB per node ({sources.get('host', 'assumed')})" if hw.host_gib else \
        "host memory not checked (trainer.host_memory_gib states a node's)"
    return f"machine: {gpu}; {host}; {hw.train_tflops:g} TFLOP/s per device (assumed)"


def as_json(plan: RunPlan) -> dict[str, Any]:
    """The plan as JSON (every term of every phase) with its problems."""
    return {**plan.to_dict(), "problems": as_dicts(plan, problems(plan))}
