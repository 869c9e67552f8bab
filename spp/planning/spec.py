"""The inputs of a run plan, as plain values: the model's shape and what the job asks (no config types here, so
``spp.planning`` imports nothing of ``spp.training`` or ``spp.eval``; ``spp.planning.job`` builds these from a job).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spp.planning.pruning import Calibration
from spp.planning.shapes import ModelShape
from spp.projections import is_default, matches


@dataclass(frozen=True)
class AdapterSpec:
    """The adapter that trains (``adapter.*``), as its method answers for this model (``spp.planning.adapter``).

    Attributes:
        trainable: Values of the whole tensors ``inject`` makes trainable (what gradients and AdamW hold).
        trainable_bytes: Their bytes, each in its dtype (masked full and norms train the model's own tensors).
        added_bytes: Bytes of the trainable tensors the method adds (what the adapter files hold).
        dropout: Dropout on the adapter branch (> 0 keeps a dropped-out copy of each adapted input).
        keeps_weight: Each adapted weight's merged copy is kept from forward to backward.
        forward_transient_values: Activation values forward builds for the largest adapted linear and keeps.
        Other fields: the ``AdapterMethod`` answers of the same names.
    """

    name: str = ""
    trains: bool = True
    trainable: int = 0
    trainable_bytes: int = 0
    added_bytes: int = 0
    flops: int = 0
    targets: tuple[str, ...] = ()
    dropout: float = 0.0
    keeps_weight: bool = False
    resident: tuple[tuple[str, int], ...] = ()
    forward_transient_values: int = 0
    backward_transient_bytes: int = 0

    def dims(self, shape: ModelShape) -> list[tuple[int, int]]:
        """``(out, in)`` of each adapted linear of one block."""
        every = is_default(self.targets)  # the default list stands for every block projection of any family
        return [d for n, d in shape.block_linears.items() if every or matches(f"model.layers.0.{n}", self.targets)]

    def adapted_weights(self, shape: ModelShape) -> int:
        """Weights of the adapted linears over the model."""
        return sum(o * i for o, i in self.dims(shape)) * shape.blocks


@dataclass(frozen=True)
class TrainSpec:
    """The training phase (``data.*``, ``trainer.*``, ``strategy.*``).

    Attributes:
        micro_batch: Examples per device per forward (``data.train_batch_size``).
        seqlen: Tokens per example at most (``data.max_length``): the activation bound.
        tokens_per_example: Tokens per example the time estimate assumes (padded to the longest of its batch).
        max_steps: Optimiser steps at most (-1: the epochs decide).
        global_batch: Examples per optimiser step over every device.
        checkpoints_kept: Adapter checkpoints on disk at once (``save_top_k`` + ``last.ckpt``).
    """

    micro_batch: int = 8
    seqlen: int = 512
    tokens_per_example: int = 512
    checkpointing: bool = False
    examples: int = 0
    epochs: int = 1
    max_steps: int = -1
    global_batch: int = 8
    checkpoints_kept: int = 2


@dataclass(frozen=True)
class EvalSpec:
    """Perplexities and lm-eval tasks (``eval.*``, ``dense_ppl``, ``pruned_ppl``).

    Attributes:
        ppl_windows: Perplexity windows of one measurement (per source).
        before: Measurements before training (dense and/or pruned, main source only).
        text_tokens: Tokens of the main perplexity text, tokenized whole by every rank that measures.
        extra_ppl_windows: Windows of ``eval.extra_ppl_sources`` together (measured after training only).
        extra_text_tokens: Tokens of the largest of their texts (each is tokenized in turn).
        lm_eval_tokens: Tokens lm-eval feeds the model (0: no task).
    """

    ppl_windows: int = 0
    seqlen: int = 2048
    batch: int = 1
    before: int = 0
    text_tokens: int = 0
    extra_ppl_windows: int = 0
    extra_text_tokens: int = 0
    lm_eval_tokens: int = 0
    lm_eval_batch: int = 1


@dataclass(frozen=True)
class ReconstructSpec:
    """Block-wise reconstruction (``reconstruct=blockwise``), its form's tensors counted on a ``meta`` block.

    Attributes:
        form: The trainable form (an adapter method).
        nsamples: Calibration windows over every rank.
        act_bytes: Bytes per value of ``reconstruct.dtype`` (the block, the kept hidden states, the activations).
        sparse_inputs: ``reconstruct.inputs=sparse`` (the prefix's outputs are kept beside the dense states).
        trainable_params: Values the form trains in one block (whole tensors: what gradients and AdamW hold).
        added_bytes: Bytes the form adds to one block (masked full: its packed masks only).
        dropout_inputs: Input features per token whose dropped-out copy (and mask) the form keeps for backward.
        forward_transient_values: Values of ``reconstruct.dtype`` its forward builds for the largest adapted weight
            and keeps until backward.
    """

    form: str = ""
    nsamples: int = 128
    seqlen: int = 2048
    epochs: int = 3
    act_bytes: int = 4
    sparse_inputs: bool = True
    trainable_params: int = 0
    trainable_bytes: int = 0
    added_bytes: int = 0
    dropout_inputs: int = 0
    largest_adapted: int = 0
    forward_transient_values: int = 0


@dataclass(frozen=True)
class RunSpec:
    """Everything a run plan needs.

    Attributes:
        devices: Processes (devices) per node.
        strategy: ``single``, ``ddp``, ``fsdp`` (FSDP2) or ``deepspeed``.
        act_bytes: Bytes per activation value (2 under bf16/fp16 precision, 4 under fp32).
        source: Where the weights come from: ``dir``/``hub`` (safetensors), ``gguf`` or ``tiny`` (built in code).
        prunes: Whether a pruning runs (a pruner and a sparsity that is not dense).
        updates_weights: The pruner changes kept weights (SparseGPT): the cache entry holds the pruned weights.
        uses_hessian: Memory and time are counted as SparseGPT's (Hessians solved on owner ranks), else as a
            cheap per-matrix rule's.
        teacher: What the objective needs of the dense teacher per batch: ``none``, ``logits`` or
            ``block_outputs``. With one, rank 0 keeps a frozen dense copy from load to placement, and fit holds
            the teacher placed like the student.
        reconstruct: Block-wise reconstruction after pruning (``None``: ``reconstruct=none``).
    """

    shape: ModelShape
    kind: str = "gpu"
    devices: int = 1
    nodes: int = 1
    strategy: str = "single"
    zero_stage: int = 2
    act_bytes: int = 2
    source: str = "dir"
    adapter: AdapterSpec = field(default_factory=AdapterSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    pruner: str = "none"
    prunes: bool = False
    updates_weights: bool = False
    uses_hessian: bool = False
    calibration: Calibration = field(default_factory=Calibration)
    true_sequential: bool = False
    export_merged: bool = True
    export_adapter: bool = True
    teacher: str = "none"
    reconstruct: ReconstructSpec | None = None

    @property
    def has_teacher(self) -> bool:
        """Whether training keeps and runs the dense teacher."""
        return self.teacher != "none" and self.adapter.trains

    @property
    def world(self) -> int:
        """Processes over every node."""
        return self.devices * self.nodes

    @property
    def sharded(self) -> bool:
        """Frozen weights sharded over the ranks (FSDP2, ZeRO-3)."""
        return self.strategy == "fsdp" or (self.strategy == "deepspeed" and self.zero_stage == 3)

    @property
    def strategy_label(self) -> str:
        """``FSDP2``, ``ZeRO-3``, ``DDP`` ... for tables."""
        if self.strategy == "deepspeed":
            return f"ZeRO-{self.zero_stage}"
        return {"fsdp": "FSDP2", "ddp": "DDP", "single": "single"}.get(self.strategy, self.strategy)
