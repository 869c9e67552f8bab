"""A training job's memory and time plan, per phase and per rank, from its :class:`~spp.planning.spec.RunSpec`.

Phases as placed in this codebase (``docs/plan.md``): load, prune, reconstruct, fit, export, evaluate. Host memory is
counted per process and per node (rank 0's node holds ``devices - 1`` other ranks); on CPU device terms are host.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from spp.planning import pruning, reconstruction
from spp.planning.flops import forward_flops, train_flops, train_tokens
from spp.planning.hardware import CPU_HOST, Hardware
from spp.planning.memory import activation_choices, fit_device_bytes, forward_bytes, optimizer_terms, resident_weights
from spp.planning.placement import EvalPlacement, eval_placement
from spp.planning.spec import RunSpec

SHARD_BYTES = 5 * 10**9
"""A safetensors shard as ``save_pretrained`` writes them (``max_shard_size="5GB"``): loading maps one shard at a
time while its tensors are copied, which the process's RSS counts."""

GGUF_LOAD_FACTOR = 0.55
"""Extra host memory while a GGUF file is dequantized, as a share of the loaded weights: SmolLM2-135M's Q4_1 file
loaded to fp32 (513 MiB) peaked 283 MiB above the loaded model (``spp.models.loading.load_model``, measured)."""

DATASET_BYTES_PER_TOKEN = 52
"""A tokenized training example is three Python lists of ints (input ids, attention mask, labels): 8-byte slots,
plus a 28-byte int object for each token id above 256."""

RECORD_BYTES = 1024
"""An Alpaca record's strings (instruction, input, output) in memory."""


@dataclass
class PhasePlan:
    """One phase: bytes by term on one device, in global rank 0's process and in any other rank's; disk; time.

    Attributes:
        where: Where the phase computes, in words (``GPU``, ``CPU``, ``host``, ``2 replicas x 4 GPUs``).
        device: Terms on one GPU (empty on a CPU run: they are in the host terms).
        rank: Terms in any process other than global rank 0's (``rank0``).
    """

    name: str
    where: str
    device: dict[str, int] = field(default_factory=dict)
    rank0: dict[str, int] = field(default_factory=dict)
    rank: dict[str, int] = field(default_factory=dict)
    processes_per_node: int = 1
    disk: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def device_bytes(self) -> int:
        """Peak bytes on one GPU."""
        return sum(self.device.values())

    @property
    def host_rank0_node(self) -> int:
        """Host bytes of the node holding global rank 0."""
        return sum(self.rank0.values()) + (self.processes_per_node - 1) * sum(self.rank.values())

    @property
    def host_other_node(self) -> int:
        """Host bytes of any other node."""
        return self.processes_per_node * sum(self.rank.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the totals."""
        return {"name": self.name, "where": self.where, "device_bytes": self.device_bytes,
                "host_rank0_node_bytes": self.host_rank0_node, "host_other_node_bytes": self.host_other_node,
                "rank0_bytes": sum(self.rank0.values()), "rank_bytes": sum(self.rank.values()),
                "seconds_total": round(sum(self.seconds.values()), 1), "device": self.device, "rank0": self.rank0,
                "rank": self.rank, "processes_per_node": self.processes_per_node, "disk": self.disk,
                "seconds": {k: round(v, 1) for k, v in self.seconds.items()}}


def _process(hw: Hardware) -> dict[str, int]:
    return {"process": hw.process_host_bytes}


def _on_host(spec: RunSpec, terms: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """``(device terms, host terms)``: on a CPU run the device's terms live in the process."""
    return ({}, dict(terms)) if spec.kind == "cpu" else (dict(terms), {})


def load_phase(spec: RunSpec, hw: Hardware) -> PhasePlan:
    """Rank 0 reads the weights into host memory; the others build the ``meta`` skeleton."""
    weights = spec.shape.weight_bytes
    transient = {"tiny": 0, "gguf": int(weights * GGUF_LOAD_FACTOR)}.get(spec.source, min(weights, SHARD_BYTES))
    rank0 = {**_process(hw), "weights": weights, "load_transient": transient}
    read = 0.0 if spec.source == "tiny" else weights / (hw.disk_gbps * 1e9)
    return PhasePlan("load", "host of rank 0", {}, rank0, _process(hw), spec.devices, {}, {"read": read})


def _ppl_device(spec: RunSpec) -> int:
    """One rank's device while perplexity is measured block by block: the block, this rank's hidden states and
    one batch's forward."""
    shape, ev = spec.shape, spec.eval
    windows = -(-ev.ppl_windows // spec.world)
    hidden = 2 * windows * ev.seqlen * shape.hidden * spec.act_bytes
    return shape.block_bytes + hidden + sum(forward_bytes(spec, ev.batch, ev.seqlen).values())


def prune_phase(spec: RunSpec, hw: Hardware) -> PhasePlan:
    """Dense perplexity, pruning and pruned perplexity, one block at a time on every rank's device."""
    shape, world, cal = spec.shape, spec.world, spec.calibration
    work = {}
    if spec.prunes:
        work["pruning"] = pruning.gpu_bytes(shape, world, cal, spec.uses_hessian, spec.true_sequential)
    if spec.eval.before:
        work["perplexity"] = _ppl_device(spec)
    peak = {"block_work": max(work.values(), default=0)}
    if spec.kind == "gpu":
        peak["cuda_context"] = hw.process_device_bytes
    device, on_host = _on_host(spec, peak)
    tokenize = {"tokenize": spec.eval.text_tokens * hw.tokenize_bytes_per_token} if spec.eval.before else {}
    rank0 = {**_process(hw), "weights": shape.weight_bytes, **on_host, **tokenize}
    if spec.has_teacher:  # the frozen dense copy, kept from load until the fit phase places it
        rank0["dense_teacher_copy"] = shape.weight_bytes
    elif spec.reconstruct is not None:  # the dense copy reconstruction trains against, taken before pruning
        rank0["dense_copy"] = shape.weight_bytes
    disk: dict[str, int] = {}
    seconds: dict[str, float] = {}
    if spec.prunes:
        rank0.update(masks=shape.pruned_params // 8, calibration_ids=cal.nsamples * cal.seqlen * 8)
        if spec.updates_weights:
            rank0["cache_writer"] = sum(o * i for o, i in shape.linears.values()) * shape.bytes_per_param
        disk["cache_entry"] = shape.pruned_params // 8 + (shape.pruned_params * shape.bytes_per_param
                                                          if spec.updates_weights else 0)
        parts = pruning.seconds(shape, world, hw, cal, spec.uses_hessian, spec.true_sequential)
        seconds = {k: v for k, v in parts.items() if k not in ("load", "total")}
    tokens = spec.eval.before * spec.eval.ppl_windows * spec.eval.seqlen
    seconds["perplexity"] = tokens * forward_flops(shape, spec.eval.seqlen) / world / (hw.eval_tflops * 1e12)
    rank = {**_process(hw), **on_host, **tokenize}
    return PhasePlan("prune", f"{spec.kind.upper()}, a block at a time", device, rank0, rank, spec.devices, disk,
                     seconds)


def _checkpoint_bytes(spec: RunSpec) -> int:
    """One adapter-only checkpoint: the trainable tensors and AdamW's state (DeepSpeed: its fp32 master and
    moments)."""
    n, nb = spec.adapter.trainable, spec.adapter.trainable_bytes
    return nb + (12 * n if spec.strategy == "deepspeed" else 2 * nb)


def fit_phase(spec: RunSpec, hw: Hardware) -> PhasePlan:
    """Placement from rank 0, then training; rank 0's host also holds the packed masks, under sharding (or
    DeepSpeed) the pruned weights it keeps for the adapter files and, at a checkpoint, the gathered trainable
    tensors and optimizer state."""
    shape, train = spec.shape, spec.train
    device, on_host = _on_host(spec, fit_device_bytes(spec, hw))
    dataset = train.examples * (train.tokens_per_example * DATASET_BYTES_PER_TOKEN + RECORD_BYTES)
    base = {**_process(hw), "dataset": dataset}
    gather = _checkpoint_bytes(spec)
    if spec.sharded or spec.strategy == "deepspeed":
        # rank 0 keeps the pruned weights through training: the adapter files are written from the model rebuilt
        # with them (spp.training.finalize.rebuild); at a checkpoint it also gathers the trained state
        transient = {"kept_pruned_weights": shape.weight_bytes, "checkpoint_gather": gather}
    elif spec.kind == "gpu":  # rank 0's weights while its replica is placed, or a checkpoint's gathered state
        transient = {"placement_weights": shape.weight_bytes} if shape.weight_bytes >= gather else \
            {"checkpoint_gather": gather}
    else:
        transient = {}
    if spec.has_teacher and spec.kind == "gpu":  # rank 0's host copy of the teacher until it is placed
        transient["teacher_placement"] = shape.weight_bytes
    rank0 = {**base, "masks": shape.pruned_params // 8 if spec.prunes else 0, **on_host, **transient}
    seconds = {"train": train_tokens(spec) * sum(train_flops(spec).values()) / spec.world / (hw.train_tflops * 1e12)}
    disk = {"checkpoints": spec.train.checkpoints_kept * gather}
    where = f"{spec.kind.upper()}, " + (f"1/{spec.world} shards" if spec.sharded else "replicas")
    return PhasePlan("fit", where, device, rank0, {**base, **on_host}, spec.devices, disk, seconds)


def deepspeed_place_phase(spec: RunSpec, hw: Hardware) -> PhasePlan:
    """DeepSpeed's placement before training: every rank materialises the whole pruned model on its GPU
    (``replicate_from_rank0``: rank 0's weights broadcast into it) before ``deepspeed.initialize`` keeps its
    partition (ZeRO-3) or its replica (ZeRO-2); ``deepspeed.zero.Init`` is not used, because the pruned weights
    exist before the strategy (``spp.training.strategies.AdapterDeepSpeedStrategy``). So a model larger than one
    GPU does not start under ZeRO-3 here; FSDP2 (``strategy=fsdp``) shards from rank 0 without it."""
    shape = spec.shape
    device = {"weights_before_partitioning": shape.weight_bytes, "cuda_context": hw.process_device_bytes}
    rank0 = {**_process(hw), "masks": shape.pruned_params // 8 if spec.prunes else 0,
             "placement_weights": shape.weight_bytes}
    return PhasePlan("place", "GPU, whole model per rank", device, rank0, _process(hw), spec.devices, {}, {})


def export_phase(spec: RunSpec, hw: Hardware) -> PhasePlan:
    """The merged model written block by block (``spp.export.merged``): block ``i`` merged and written by rank
    ``i mod N``. Sharded (FSDP2, ZeRO-3): the training shards stay on the GPUs and each block is materialised
    whole there in turn, merged on the writing rank's GPU and copied to its host to be written. Otherwise every
    rank's replica is in its host memory (Lightning's teardown moved it there) and the merge runs on the CPU."""
    shape = spec.shape
    largest = max((o * i for o, i in spec.adapter.dims(shape)), default=0)
    merge = {"block": shape.block_bytes, "merge_fp32": 2 * 4 * largest}
    gathered = spec.adapter.added_bytes
    host = {"serialised_block": shape.block_bytes}
    device: dict[str, int] = {}
    if spec.sharded and spec.kind == "gpu":
        device = {"shards": shape.weight_bytes // spec.world, **merge, "cuda_context": hw.process_device_bytes}
        where = "GPU, a block at a time"
    else:
        host.update(replica=shape.weight_bytes, **merge)
        where = "host, a block at a time"
    rank0 = {**_process(hw), "masks": shape.pruned_params // 8 if spec.prunes else 0, "adapter": gathered, **host}
    disk = {}
    if spec.export_merged:
        disk["merged_model"] = shape.weight_bytes
    if spec.export_adapter and gathered:
        disk["adapter_files"] = gathered
    moved = shape.weight_bytes * (2 if spec.export_merged else 0)
    return PhasePlan("export", where, device, rank0, {**_process(hw), **host}, spec.devices, disk,
                     {"read_and_write": moved / (hw.disk_gbps * 1e9)})


def kept_through_evaluation(spec: RunSpec) -> tuple[dict[str, int], dict[str, int]]:
    """``(device terms, rank-0 host terms)`` the job keeps of training while the export is evaluated.

    Rank 0's host keeps the packed masks (the summary counts the kept weights). Under DDP, FSDP2 and one device
    nothing stays on a device: ``spp.training.finalize.release`` drops the trained model (shards, replica), its
    gradients and optimizer state, the teacher, the gathered adapter and the pruned weights rank 0 kept
    (``tests/test_release_before_eval.py``). DeepSpeed's engine (ZeRO-2 and 3) is still alive then (measured with
    that test's probe on 2 CPU processes): its resident weights and optimizer terms stay on every GPU.
    """
    host = {"masks": spec.shape.pruned_params // 8} if spec.prunes else {}
    if spec.strategy != "deepspeed" or spec.kind != "gpu" or not spec.adapter.trains:
        return {}, host
    left = {**resident_weights(spec), **optimizer_terms(spec)}
    left.pop("gathered", None)
    return {f"deepspeed_{name}": v for name, v in left.items() if v}, host


def evaluate_phase(spec: RunSpec, hw: Hardware, placement: EvalPlacement) -> PhasePlan:
    """Each replica loads the merged model from the export and evaluates its share of windows and requests; rank 0
    also holds what the job keeps of training (:func:`kept_through_evaluation`)."""
    shape, ev = spec.shape, spec.eval
    forward = eval_forward(spec)
    kept_device, kept = kept_through_evaluation(spec)
    text = max(ev.text_tokens, ev.extra_text_tokens) if ev.ppl_windows else 0  # the sources tokenized in turn
    proc = {**_process(hw), "lm_eval": hw.lm_eval_host_bytes if ev.lm_eval_tokens else 0,
            "tokenize": text * hw.tokenize_bytes_per_token}
    if placement.how == "cpu":
        proc.update(weights=shape.weight_bytes, forward=sum(forward.values()))
        proc = {k: v for k, v in proc.items() if v}
        seconds = _eval_seconds(spec, hw, placement)
        if spec.kind == "cpu":  # every process a replica of its own (spp.eval.evaluate)
            where = f"CPU, {placement.replicas} replica" + ("s" if placement.replicas > 1 else "")
            return PhasePlan("evaluate", where, {}, {**proc, **kept}, proc, spec.devices, {}, seconds)
        return PhasePlan("evaluate", "CPU (rank 0)", {}, {**proc, **kept}, {}, 1, {}, seconds)  # GPU job: no fit
    k = placement.gpus_per_replica
    device = {"weights": shape.weight_bytes // k + (shape.block_bytes if k > 1 else 0), **forward,
              "cuda_context": hw.process_device_bytes, **kept_device}
    proc = {name: v for name, v in proc.items() if v}
    per_node = placement.replicas // spec.nodes
    # the export's shards mapped while the replicas load them: page cache the node's processes share, counted once
    rank0 = {**proc, **kept, "mapped_shards": min(shape.weight_bytes, per_node * SHARD_BYTES)}
    where = f"{placement.replicas} x {k} GPU" + ("s" if k > 1 else "")
    return PhasePlan("evaluate", where, device, rank0, proc, per_node, {}, _eval_seconds(spec, hw, placement))


def _eval_seconds(spec: RunSpec, hw: Hardware, placement: EvalPlacement) -> dict[str, float]:
    """Loading the export, then every window and request split over the replicas (a ``parallelize`` replica
    computes on one GPU at a time)."""
    shape, ev = spec.shape, spec.eval
    tokens = (ev.ppl_windows + ev.extra_ppl_windows) * ev.seqlen + ev.lm_eval_tokens
    rate = CPU_HOST.eval_tflops if placement.how == "cpu" else hw.eval_tflops  # a GPU job's fallback too
    return {"load": shape.weight_bytes / (hw.disk_gbps * 1e9),
            "forward": tokens * forward_flops(shape, ev.seqlen) / placement.replicas / (rate * 1e12)}


@dataclass
class RunPlan:
    """The plan of one job: its phases, the evaluation placement, and the figures it was checked against."""

    spec: RunSpec
    hardware: Hardware
    phases: list[PhasePlan]
    placement: EvalPlacement

    def phase(self, name: str) -> PhasePlan | None:
        """The phase called ``name`` (``None`` when the job has none, e.g. ``fit`` with ``adapter=none``)."""
        return next((p for p in self.phases if p.name == name), None)

    @property
    def peak_device_bytes(self) -> int:
        """The largest per-GPU need over the phases (0 on a CPU run)."""
        return max((p.device_bytes for p in self.phases), default=0)

    @property
    def peak_host_node_bytes(self) -> int:
        """The largest host need of a node over the phases (rank 0's node)."""
        return max(p.host_rank0_node for p in self.phases)

    def peak_process_bytes(self, rank0: bool = True) -> int:
        """The largest host need of global rank 0's process (``rank0``) or of any other rank's."""
        return max(sum((p.rank0 if rank0 else p.rank).values()) for p in self.phases)

    @property
    def seconds(self) -> float:
        """Estimated time of the whole job."""
        return sum(sum(p.seconds.values()) for p in self.phases)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the job's figures, every phase, the placement, the hardware and the peaks."""
        s = self.spec
        return {"model": s.shape.name, "params": s.shape.params, "weight_bytes": s.shape.weight_bytes,
                "kind": s.kind, "devices_per_node": s.devices, "nodes": s.nodes, "strategy": s.strategy_label,
                "adapter": s.adapter.name, "trainable_params": s.adapter.trainable,
                "peak_device_bytes": self.peak_device_bytes, "peak_host_node_bytes": self.peak_host_node_bytes,
                "peak_rank0_bytes": self.peak_process_bytes(True), "peak_rank_bytes": self.peak_process_bytes(False),
                "seconds": round(self.seconds, 1), "phases": [p.to_dict() for p in self.phases],
                "eval_placement": asdict(self.placement), "hardware": asdict(self.hardware),
                "optimizer": optimizer_terms(s) if s.adapter.trains else {},
                "activations_with_and_without_checkpointing": list(activation_choices(s)) if s.adapter.trains else []}


def eval_forward(spec: RunSpec) -> dict[str, int]:
    """The larger of a perplexity batch and an lm-eval batch (``eval.seqlen`` tokens each, the bound of both)."""
    ev = spec.eval
    return max(forward_bytes(spec, ev.batch, ev.seqlen), forward_bytes(spec, ev.lm_eval_batch, ev.seqlen),
               key=lambda d: sum(d.values()))


def plan_run(spec: RunSpec, hw: Hardware) -> RunPlan:
    """The phases of ``spec`` on ``hw`` (``adapter=none`` has no fit phase; a job without perplexity or tasks no
    evaluate phase)."""
    beside = sum(eval_forward(spec).values()) + hw.process_device_bytes
    placement = (eval_placement(spec.shape.weight_bytes, hw.device_bytes, spec.devices, spec.nodes,
                                spec.shape.block_bytes, beside) if spec.kind == "gpu" else
                 EvalPlacement(spec.world, 0, "cpu", f"on CPUs each of the {spec.world} process(es) evaluates as a "
                                                     "replica of its own (spp.eval.evaluate)"))
    phases = [load_phase(spec, hw), prune_phase(spec, hw)]
    if spec.reconstruct is not None:
        phases.append(PhasePlan("reconstruct", *reconstruction.phase_parts(spec, spec.reconstruct, hw)))
    if spec.adapter.trains:
        if spec.strategy == "deepspeed" and spec.kind == "gpu":
            phases.append(deepspeed_place_phase(spec, hw))
        phases.append(fit_phase(spec, hw))
    if spec.export_merged or spec.export_adapter:
        phases.append(export_phase(spec, hw))
    if spec.eval.ppl_windows or spec.eval.lm_eval_tokens:
        phases.append(evaluate_phase(spec, hw, placement))
    return RunPlan(spec, hw, phases, placement)
