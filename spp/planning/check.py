"""Which phases of a run plan do not fit the machine (GPU memory, or host memory of rank 0's or any other node), and
the one-line refusal naming the first single change, in the order below, whose re-plan fits (else all of them
together, else more or larger GPUs / a larger node):

* fit: activation checkpointing, a smaller per-device batch (a divisor of the global batch), FSDP2, more GPUs;
* prune: a smaller calibration batch, more GPUs (the hidden states are split over the ranks);
* reconstruct: ``reconstruct.dtype=bfloat16``, fewer windows, more GPUs (the windows are split over the ranks);
* place (DeepSpeed: the whole model on every GPU before partitioning): FSDP2;
* evaluate: batches of one window / request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from spp.errors import UserError
from spp.planning.hardware import GIB
from spp.planning.run import RunPlan, eval_forward, plan_run
from spp.planning.spec import RunSpec

OTHER_NODE = "host of another node"


@dataclass(frozen=True)
class Problem:
    """A phase that does not fit: ``memory`` is ``GPU`` (per device), ``host`` (rank 0's node) or ``host of
    another node``."""

    phase: str
    memory: str
    need: int
    have: int
    terms: dict[str, int]


def problems(plan: RunPlan) -> list[Problem]:
    """Every phase whose GPU or host peak exceeds the plan's hardware figures (unknown figures are not checked)."""
    hw, spec, out = plan.hardware, plan.spec, []
    for p in plan.phases:
        if spec.kind == "gpu" and hw.device_bytes and p.device_bytes > hw.device_bytes:
            out.append(Problem(p.name, "GPU", p.device_bytes, hw.device_bytes, p.device))
        if spec.kind == "gpu" and hw.device_bytes and p.name == "evaluate" and plan.placement.how == "cpu":
            out.append(_no_replica(plan, hw.device_bytes))
        if hw.host_bytes and p.host_rank0_node > hw.host_bytes:
            out.append(Problem(p.name, "host", p.host_rank0_node, hw.host_bytes, p.rank0))
        if hw.host_bytes and spec.nodes > 1 and p.host_other_node > hw.host_bytes:
            out.append(Problem(p.name, OTHER_NODE, p.host_other_node, hw.host_bytes, p.rank))
    return out


def _no_replica(plan: RunPlan, device: int) -> Problem:
    """A GPU job whose merged model fits no group of its node's GPUs (with the evaluation batch): evaluating it on
    the CPU would take days, so it counts as not fitting; ``need`` is a GPU's part with every GPU of a node."""
    spec = plan.spec
    share = spec.shape.weight_bytes // spec.devices + (spec.shape.block_bytes if spec.devices > 1 else 0)
    terms = {"weights": share, **eval_forward(spec), "cuda_context": plan.hardware.process_device_bytes}
    return Problem("evaluate", "GPU", sum(terms.values()), device, terms)


def _batches(b: int, whole: int | None) -> list[int]:
    """Smaller batches than ``b`` (halving down to 1) that divide ``whole`` (when given)."""
    out = []
    while b > 1:
        b //= 2
        if whole is None or whole % max(b, 1) == 0:
            out.append(max(b, 1))
    return out


def remedies(spec: RunSpec, phase: str) -> list[dict[str, Any]]:
    """The overrides (``{key: value}``, in order) to try for a phase that does not fit (module docstring)."""
    train, fsdp = spec.train, {"strategy": "fsdp"}
    more = [{"trainer.devices": n} for n in (2, 4, 8) if n > spec.devices]  # the hidden states or windows split
    if phase == "fit":
        checkpointing = [] if train.checkpointing else [{"trainer.gradient_checkpointing": "true"}]
        batches = [{"data.train_batch_size": b} for b in _batches(train.micro_batch, train.global_batch)]
        return checkpointing + batches + ([] if spec.sharded else [fsdp]) + [{**fsdp, **n} for n in more]
    if phase == "prune":
        return [{"calibration.batch_size": b} for b in _batches(spec.calibration.batch_size, None)] + more
    if phase == "reconstruct" and spec.reconstruct is not None:
        rc = spec.reconstruct
        dtype = [] if rc.act_bytes <= 2 else [{"reconstruct.dtype": "bfloat16"}]
        return dtype + [{"reconstruct.nsamples": n} for n in _batches(rc.nsamples, None)] + more
    # place: DeepSpeed materialises the whole model on every GPU first; FSDP2 does not
    return {"place": [fsdp], "evaluate": [{"eval.batch_size": 1, "eval.lm_eval_batch_size": 1}]}.get(phase, [])


def applied(spec: RunSpec, overrides: dict[str, Any]) -> RunSpec:
    """``spec`` with :func:`remedies`' ``overrides`` (``strategy=fsdp`` checkpoints every block, as
    ``conf/strategy/fsdp.yaml`` does)."""
    get, train, rc = overrides.get, spec.train, spec.reconstruct
    fsdp = get("strategy") == "fsdp"
    train = replace(train, checkpointing=train.checkpointing or fsdp or "trainer.gradient_checkpointing" in overrides,
                    micro_batch=get("data.train_batch_size", train.micro_batch))
    if rc is not None:
        rc = replace(rc, act_bytes=2 if "reconstruct.dtype" in overrides else rc.act_bytes,
                     nsamples=get("reconstruct.nsamples", rc.nsamples))
    return replace(spec, train=train, strategy="fsdp" if fsdp else spec.strategy, reconstruct=rc,
                   devices=get("trainer.devices", spec.devices),
                   calibration=replace(spec.calibration, batch_size=get("calibration.batch_size",
                                                                        spec.calibration.batch_size)),
                   eval=replace(spec.eval, batch=get("eval.batch_size", spec.eval.batch),
                                lm_eval_batch=get("eval.lm_eval_batch_size", spec.eval.lm_eval_batch)))


def fix(plan: RunPlan, problem: Problem) -> tuple[str, str]:
    """``(fix text, config key)`` for ``problem`` (module docstring)."""
    def solved(spec: RunSpec) -> bool:
        left = problems(plan_run(spec, plan.hardware))
        return not any(p.phase == problem.phase and p.memory == problem.memory for p in left)

    tried = remedies(plan.spec, problem.phase)
    for overrides in tried:
        if solved(applied(plan.spec, overrides)):
            return f"set {' '.join(f'{k}={v}' for k, v in overrides.items())} (planned to fit)", next(iter(overrides))
    if len(tried) > 1:  # all of them together: the largest device count, the smallest batches
        merged: dict[str, Any] = {}
        for overrides in tried:
            merged.update({k: (max if k == "trainer.devices" else min)(merged.get(k, v), v)
                           for k, v in overrides.items()})
        combined = applied(plan.spec, merged)
        if solved(combined):
            changes = _changes(plan.spec, combined)
            return f"set {' '.join(changes)} (planned to fit)", changes[0].split("=")[0]
    if problem.memory == "GPU":
        return (f"use GPUs with more than {problem.need / GIB:.0f} GiB or more GPUs (trainer.devices, "
                "trainer.num_nodes); trainer.device_memory_gib states the GPU's memory"), "trainer.device_memory_gib"
    if problem.memory == OTHER_NODE:
        return (f"run fewer processes per node (trainer.devices) or on nodes with at least {problem.need / GIB:.0f} "
                "GiB of host memory; trainer.host_memory_gib states a node's memory"), "trainer.devices"
    return (f"run on a node with at least {problem.need / GIB:.0f} GiB of host memory (global rank 0 holds the "
            "whole model while pruning), or fewer processes per node (trainer.devices); trainer.host_memory_gib "
            "states a node's memory"), "trainer.host_memory_gib"


def _changes(old: RunSpec, new: RunSpec) -> list[str]:
    """The overrides that turn ``old`` into ``new`` (the fields :func:`remedies` changes)."""
    out = []
    if new.train.checkpointing != old.train.checkpointing and new.strategy == old.strategy:
        out.append("trainer.gradient_checkpointing=true")
    if new.train.micro_batch != old.train.micro_batch:
        out.append(f"data.train_batch_size={new.train.micro_batch}")
    if new.strategy != old.strategy:
        out.append(f"strategy={new.strategy}")
    if new.devices != old.devices:
        out.append(f"trainer.devices={new.devices}")
    if new.calibration.batch_size != old.calibration.batch_size:
        out.append(f"calibration.batch_size={new.calibration.batch_size}")
    if new.reconstruct is not None and old.reconstruct is not None:
        if new.reconstruct.act_bytes != old.reconstruct.act_bytes:
            out.append("reconstruct.dtype=bfloat16")
        if new.reconstruct.nsamples != old.reconstruct.nsamples:
            out.append(f"reconstruct.nsamples={new.reconstruct.nsamples}")
    if (new.eval.batch, new.eval.lm_eval_batch) != (old.eval.batch, old.eval.lm_eval_batch):
        out.append(f"eval.batch_size={new.eval.batch} eval.lm_eval_batch_size={new.eval.lm_eval_batch}")
    return out


def refusal(plan: RunPlan, problem: Problem, source: str) -> UserError:
    """The one-line :class:`UserError` for ``problem``; ``source`` says where the machine figure came from."""
    s = plan.spec
    text, key = fix(plan, problem)
    largest = sorted(problem.terms.items(), key=lambda kv: -kv[1])[:3]
    top = ", ".join(f"{k.replace('_', ' ')} {v / GIB:.1f}" for k, v in largest)
    where = {"GPU": "per GPU", OTHER_NODE: "of host memory on each node but global rank 0's"}.get(
        problem.memory, "of host memory on global rank 0's node")
    what = (f"the {problem.phase} phase of {s.shape.name} ({s.shape.params / 1e9:.1f} B parameters, {s.strategy_label} "
            f"on {s.devices} device(s) x {s.nodes} node(s)) needs {problem.need / GIB:.1f} GiB {where} "
            f"({top} GiB, ...) but has {problem.have / GIB:.1f} GiB ({source})")
    return UserError(what, f"{text}; add plan=true to see every phase", key=key)


def check(plan: RunPlan, sources: dict[str, str]) -> None:
    """Raise the :func:`refusal` of the first problem of ``plan`` (``sources``: ``GPU``/``host`` -> where the
    figure came from)."""
    found = problems(plan)
    if found:
        memory = "host" if found[0].memory == OTHER_NODE else found[0].memory
        raise refusal(plan, found[0], sources.get(memory, ""))


def describe(found: list[Problem]) -> list[str]:
    """One line per problem, for the plan's printout."""
    return [f"does not fit: {p.phase} needs {p.need / GIB:.1f} GiB {p.memory}, has {p.have / GIB:.1f} GiB"
            for p in found]


def as_dicts(plan: RunPlan, found: list[Problem]) -> list[dict[str, Any]]:
    """JSON-ready problems, each with the fix :func:`fix` offers."""
    return [{"phase": p.phase, "memory": p.memory, "need_bytes": p.need, "have_bytes": p.have,
             "fix": fix(plan, p)[0]} for p in found]
