"""Structured configs of the training groups and the typed top-level job of ``train.py``, registered in Hydra's
ConfigStore (:func:`register_train_schema`) so a misspelled key or a wrong type fails at compose time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from spp.adapters.config import AdapterConfig
from spp.choices import Choice
from spp.data.config import DataConfig
from spp.errors import to_job
from spp.eval.config import EvalConfig
from spp.generation import FIXED_PROMPT
from spp.job_base import CacheLockJobConfig
from spp.loggers import LoggersConfig
from spp.pruning.config import PrunedModelGroups
from spp.training.objectives import ObjectiveConfig


class Scheduler(Choice):
    """Learning-rate decay after the linear warm-up (``transformers.get_scheduler`` names in ``hf_name``)."""

    linear = "linear"
    cosine = "cosine"
    constant = "constant"


    @property
    def hf_name(self) -> str:
        """The ``transformers.get_scheduler`` name (constant after warm-up is ``constant_with_warmup``)."""
        return "constant_with_warmup" if self is Scheduler.constant else self.value


class ProgressBar(Choice):
    """Training progress display: a Rich or tqdm bar on a terminal, or periodic log lines (``log``).

    ``rich`` and ``tqdm`` fall back to ``log`` when stdout is not a TTY (``tee``, a batch job's log file).
    """

    rich = "rich"
    tqdm = "tqdm"
    log = "log"
    none = "none"



class SweepObjective(Choice):
    """What ``train.py`` returns to a Hydra sweeper (``sweep_objective``): a validation metric, never a test one by
    default. Not the training loss, which is the ``objective`` group."""

    val_loss = "val_loss"
    ppl_val_merged = "ppl_val_merged"
    ppl_merged = "ppl_merged"
    none = "none"



@dataclass
class TrainerConfig:
    """Optimisation and Lightning ``Trainer`` settings (``conf/trainer/*.yaml``).

    ``lr`` and ``max_epochs`` default (in ``conf/trainer/default.yaml``) to the model group's paper values, and
    the per-device batch to ``model.per_device_batch_size`` through ``data.train_batch_size``.

    Attributes:
        accelerator: ``auto``, ``cpu`` or ``gpu``.
        devices: Devices per node (int, list or ``auto``).
        num_nodes: Nodes.
        precision: ``auto`` (``bf16-mixed`` on a GPU with bf16, else ``32-true``) or any Lightning precision.
        lr: Peak learning rate (AdamW).
        weight_decay: AdamW weight decay (authors: 0.001).
        betas: AdamW betas.
        warmup_ratio: Share of optimisation steps spent in linear warm-up (authors: 0.03).
        scheduler: Decay after warm-up: ``linear`` (authors), ``cosine`` or ``constant``.
        max_epochs: Epochs (the paper: 3 for 7-30B, 1 for 65B/70B).
        max_steps: Stop after this many optimiser steps (``-1`` = epochs decide; ``0`` = none: with
            ``reconstruct=blockwise``, reconstruct only, then merge, audit, export and evaluate).
        global_batch_size: Examples per optimiser step over all devices; sets gradient accumulation to
            ``global / (per-device batch * world size)``. ``None`` = use ``accumulate_grad_batches``.
        accumulate_grad_batches: Micro-batches per optimiser step when ``global_batch_size`` is ``None``.
        gradient_clip_val: Gradient-norm clip (``None`` = off).
        gradient_checkpointing: Recompute decoder activations in backward (HF gradient checkpointing).
        compile: Train through ``torch.compile`` (off by default; measured effect in ``benchmarks/README.md``).
        val_check_interval: Lightning ``val_check_interval`` (float = share of an epoch, int = batches).
        limit_val_batches: Lightning ``limit_val_batches``.
        num_sanity_val_steps: Lightning ``num_sanity_val_steps``.
        log_every_n_steps: Logging interval in optimiser steps.
        checkpoint_every_n_steps: Adapter-only checkpoint every N optimiser steps (``None`` = each epoch end).
            Ctrl-C always writes one of the step it finishes, and logs the command that resumes it.
        save_top_k: Adapter checkpoints kept (``-1`` = all); ``last.ckpt`` is always kept.
        curve_every_n_steps: Recovery curve (``<run_dir>/recovery_curve.json``): the merged model's WikiText-2
            validation perplexity at fit start, every N optimiser steps and at fit end, with the training CPU
            seconds spent so far (``spp.training.callbacks.recovery_curve``); ``None`` = off. One process only.
        resume_from: Checkpoint to resume (adapter, optimizer, scheduler, loops, position in the epoch, random
            state: the run continues exactly): a ``.ckpt`` path, or ``last`` = ``<run_dir>/checkpoints/last.ckpt``
            (pass the interrupted run's ``run_dir=`` too, since every Hydra run gets a new directory).
        progress_bar: ``rich``, ``tqdm``, ``log`` (one log line every ``progress_every_s`` seconds: step, loss,
            tokens/s, ETA; chosen automatically when stdout is not a terminal) or ``none``.
        progress_every_s: Seconds between two progress log lines (``progress_bar=log`` or stdout not a TTY).
        deterministic: Lightning ``deterministic``.
        device_memory_gib: Memory of one GPU, in GiB, for the memory plan (``docs/plan.md``); ``None`` = the real
            GPU's when CUDA is available (no GPU check otherwise), and 80 for ``plan=true``.
        host_memory_gib: Host memory of one node, in GiB, for the memory plan; ``None`` = this machine's (or its
            cgroup limit, e.g. a Slurm job's ``--mem``); not checked by ``plan=true``.
    """

    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    precision: str = "auto"
    lr: float = 4e-3
    weight_decay: float = 0.001
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_ratio: float = 0.03
    scheduler: Scheduler = Scheduler.linear
    max_epochs: int = 3
    max_steps: int = -1
    global_batch_size: int | None = None
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_checkpointing: bool = False
    compile: bool = False
    val_check_interval: Any = 1.0
    limit_val_batches: Any = 1.0
    num_sanity_val_steps: int = 0
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int | None = None
    save_top_k: int = 1
    curve_every_n_steps: int | None = None
    resume_from: str | None = None
    progress_bar: ProgressBar = ProgressBar.rich
    progress_every_s: float = 30.0
    deterministic: bool = False
    device_memory_gib: float | None = None
    host_memory_gib: float | None = None

    def __post_init__(self) -> None:
        devices = self.devices
        checks = [
            (len(devices) > 0 if isinstance(devices, (list, tuple)) else
             str(devices) in ("auto", "-1") or (str(devices).isdigit() and int(devices) >= 1),
             f"trainer.devices={devices} must be a count >= 1, a non-empty list of device indices, or auto"),
            (isinstance(self.num_nodes, int) and self.num_nodes >= 1,
             f"trainer.num_nodes={self.num_nodes} must be >= 1"),
            (self.device_memory_gib is None or 0 < self.device_memory_gib < math.inf,
             f"trainer.device_memory_gib={self.device_memory_gib} must be a finite number > 0 or null (the GPU's)"),
            (self.host_memory_gib is None or 0 < self.host_memory_gib < math.inf,
             f"trainer.host_memory_gib={self.host_memory_gib} must be a finite number > 0 or null (this machine's)"),
            (math.isfinite(self.lr) and self.lr > 0, f"trainer.lr={self.lr} must be a finite number > 0"),
            (0.0 <= self.warmup_ratio < 1.0, f"trainer.warmup_ratio={self.warmup_ratio} must be in [0, 1)"),
            (self.weight_decay >= 0, f"trainer.weight_decay={self.weight_decay} must be >= 0"),
            (self.accumulate_grad_batches >= 1, "trainer.accumulate_grad_batches must be >= 1"),
            (self.global_batch_size is None or self.global_batch_size >= 1,
             f"trainer.global_batch_size={self.global_batch_size} must be >= 1 or null"),
            (self.max_steps >= -1, f"trainer.max_steps={self.max_steps}: -1 (epochs decide), 0 (no optimiser step: "
             "a reconstruction-only run still merges, audits, exports and evaluates) or >= 1"),
            (self.max_epochs >= 1, f"trainer.max_epochs={self.max_epochs} must be >= 1"),
            (self.curve_every_n_steps is None or self.curve_every_n_steps >= 1,
             f"trainer.curve_every_n_steps={self.curve_every_n_steps} must be >= 1 or null (off)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


class StrategyName(Choice):
    """Distributed strategies: Lightning's DDP, FSDP2 (``ModelParallelStrategy``) and DeepSpeed ZeRO."""

    auto = "auto"
    ddp = "ddp"
    fsdp = "fsdp"
    deepspeed = "deepspeed"



@dataclass
class StrategyConfig:
    """Distributed strategy (``conf/strategy/*.yaml``), built with Lightning's own strategy classes.

    Attributes:
        name: ``auto`` (one device), ``ddp``, ``fsdp`` (FSDP2 ``fully_shard`` per decoder block through
            Lightning's ``ModelParallelStrategy``; runs on CPU processes with gloo as well as on GPUs) or
            ``deepspeed`` (GPUs only).
        process_group_backend: ``nccl`` / ``gloo``; ``None`` = ``gloo`` on CPU, Lightning's choice on GPU.
        timeout_s: Process-group timeout in seconds: how long a rank waits in an ordinary collective (training,
            pruning and export steps, where every rank does the same work) for a hung rank before the job stops
            and names it. Waits for another rank's solo work use their own, longer groups (docs/multinode.md).
        find_unused_parameters: DDP ``find_unused_parameters``.
        activation_checkpointing: FSDP: recompute each decoder block's activations in backward.
        reshard_after_forward: FSDP2 ``reshard_after_forward`` (``False`` keeps gathered parameters between
            forward and backward: faster, more memory).
        stage: DeepSpeed ZeRO stage (2 or 3).
        offload_optimizer: DeepSpeed optimizer offload to CPU.
        offload_parameters: DeepSpeed parameter offload to CPU (stage 3).
    """

    name: StrategyName = StrategyName.auto
    process_group_backend: str | None = None
    timeout_s: int = 600
    find_unused_parameters: bool = False
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True
    stage: int = 2
    offload_optimizer: bool = False
    offload_parameters: bool = False

    def __post_init__(self) -> None:
        if self.stage not in (2, 3):
            raise ValueError(f"strategy.stage={self.stage}: DeepSpeed ZeRO stage 2 or 3")
        if self.timeout_s < 1:
            raise ValueError(f"strategy.timeout_s={self.timeout_s} must be >= 1 (seconds)")


@dataclass
class ExportConfig:
    """What is written at fit end (``export.*``).

    Attributes:
        merged: Keep the merged sparse model + tokenizer in ``<run_dir>/merged`` (Hugging Face layout, one
            safetensors shard per decoder block, written block by block on every rank: ``spp.export.merged``).
            ``false``: it is still written to a temporary folder when something evaluates it, then removed.
        adapter: Write the adapter files (``adapter_config.json`` + ``adapter_model.safetensors``).
    """

    merged: bool = True
    adapter: bool = True


@dataclass
class SampleConfig:
    """One greedy completion of a fixed prompt from the dense, pruned and merged models (``sample.*``), printed in
    the final table and stored in ``summary.json`` so a run shows what its model says.

    Attributes:
        enabled: Generate the three completions (rank 0; a few seconds on the CPU demo).
        prompt: The instruction, wrapped in the Alpaca template the adapter was tuned with.
        max_new_tokens: Tokens generated at most (greedy).
    """

    enabled: bool = True
    prompt: str = FIXED_PROMPT
    max_new_tokens: int = 24

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"sample.max_new_tokens={self.max_new_tokens} must be >= 1; set it >= 1, or "
                             "sample.enabled=false")


@dataclass
class GuardsConfig:
    """Divergence guards (``guards.*``, ``docs/errors.md``): a run that went wrong is not reported as a success.

    Attributes:
        enabled: Check the run at all (the non-finite loss / gradient-norm stop is always on).
        max_ppl_ratio: ``diverged`` when the merged perplexity exceeds the pruned model's by more than this factor.
        loss_must_fall: ``diverged`` when the training loss rose over the run: the mean of the last losses exceeds
            the mean of the first (windows of a third of the steps, 2 to 10 each; 1 below 6 steps) by more than
            twice the standard error of that difference *and* by more than 1 % of the first mean. Runs of fewer
            than 4 steps are not judged (noise, not a trend).
        loss_blowup_factor: Stop training early when the loss of ``loss_blowup_steps`` consecutive optimiser steps
            is above ``loss_blowup_factor`` × the first step's loss, and above it by more than
            ``loss_blowup_margin`` (nats). Defaults 2 × and 3 nats: a blown-up learning rate gives 2.5 × (SPP on
            SmolLM2 at lr 1e3: the loss of uniform guessing) to 20 × the first loss within a few steps; no recorded
            run that converged spent even 2 steps in a row above it (worst spike: 2.04 ×, once).
        loss_blowup_margin: See ``loss_blowup_factor`` (keeps a run whose first batch happened to be easy going).
        loss_blowup_steps: Consecutive optimiser steps above the bound before the run stops (``0`` = no early
            stop; the finalize checks above still apply).
    """

    enabled: bool = True
    max_ppl_ratio: float = 2.0
    loss_must_fall: bool = True
    loss_blowup_factor: float = 2.0
    loss_blowup_margin: float = 3.0
    loss_blowup_steps: int = 3

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_ppl_ratio) and self.max_ppl_ratio >= 1.0):
            raise ValueError(f"guards.max_ppl_ratio={self.max_ppl_ratio} must be a finite number >= 1")
        if not (math.isfinite(self.loss_blowup_factor) and self.loss_blowup_factor > 1.0):
            raise ValueError(f"guards.loss_blowup_factor={self.loss_blowup_factor} must be a finite number > 1")
        if not (math.isfinite(self.loss_blowup_margin) and self.loss_blowup_margin >= 0.0):
            raise ValueError(f"guards.loss_blowup_margin={self.loss_blowup_margin} must be a finite number >= 0")
        if self.loss_blowup_steps < 0:
            raise ValueError(f"guards.loss_blowup_steps={self.loss_blowup_steps} must be >= 0 (0 = off)")


@dataclass
class TrainJobConfig(PrunedModelGroups, CacheLockJobConfig):
    """The typed top-level config of ``train.py`` (``conf/train.yaml``); the shared keys are
    :class:`~spp.job_base.CacheLockJobConfig`'s, the model and pruning groups
    :class:`~spp.pruning.config.PrunedModelGroups`' (reconstruction runs after pruning, before training).

    Attributes:
        dense_ppl: Measure the dense model's perplexity before pruning (cached).
        pruned_ppl: Measure the pruned model's perplexity before training (cached).
        print_config: Print the resolved config as a Rich tree (it is always saved as
            ``<run_dir>/resolved_config.yaml``).
        objective: The training loss (``objective=ce``: the labels' cross-entropy, the paper's; ``objective=distill``:
            distillation from the dense model; ``spp.training.objectives``).
        sweep_objective: What ``train.py`` returns to a sweeper: ``val_loss`` (the last Alpaca held-out loss; the
            default, so learning rates are chosen on validation data), ``ppl_val_merged`` (the merged model's
            WikiText-2 *validation* perplexity: needs ``wikitext2_val`` in ``eval.ppl_source`` or
            ``eval.extra_ppl_sources``), ``ppl_merged`` (WikiText-2 *test* perplexity: for reporting, never for
            selection) or ``none``.
        plan: Print the job's memory and time plan (per phase: device, GPU GiB per device, host GiB per node,
            disk, time; ``docs/plan.md``) from the model's config alone and exit, reading no weight or data file.
        plan_json: With ``plan=true``, also write the plan as JSON to this file (``-`` = stdout, instead of the
            table).
    """

    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    logger: LoggersConfig = field(default_factory=LoggersConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    dense_ppl: bool = True
    pruned_ppl: bool = True
    print_config: bool = False
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    sweep_objective: SweepObjective = SweepObjective.val_loss
    plan: bool = False
    plan_json: str | None = None

    def __post_init__(self) -> None:
        if self.sweep_objective is SweepObjective.ppl_val_merged and not (
                self.eval.ppl and "wikitext2_val" in (self.eval.ppl_source, *self.eval.extra_ppl_sources)):
            raise ValueError("sweep_objective=ppl_val_merged needs the WikiText-2 validation perplexity of the merged "
                             "model: add eval.extra_ppl_sources=[wikitext2_val] (or eval.ppl_source=wikitext2_val) "
                             "and keep eval.ppl=true")
        if self.trainer.curve_every_n_steps is not None:
            curve_refusal(self)
        super().__post_init__()
        if self.trainer.global_batch_size is not None and self.trainer.global_batch_size % self.data.train_batch_size:
            raise ValueError(
                f"trainer.global_batch_size={self.trainer.global_batch_size} is not a multiple of "
                f"data.train_batch_size={self.data.train_batch_size}"
            )


def curve_refusal(job: TrainJobConfig) -> None:
    """Refuse ``trainer.curve_every_n_steps`` (one line) without ``eval.ppl``, with a sharding strategy, or on more
    than one process (as far as the config says, ``auto`` devices counted as one: the Trainer refuses the rest).

    Raises:
        ValueError: naming the key and the fix.
    """
    from spp.planning.job import device_count  # start-up time: the planner loads transformers

    key = f"trainer.curve_every_n_steps={job.trainer.curve_every_n_steps}"
    if not job.eval.ppl:
        raise ValueError(f"{key} measures the merged model's perplexity, but eval.ppl=false; set eval.ppl=true or "
                         "trainer.curve_every_n_steps=null")
    world = device_count(job.trainer.devices, "cpu") * job.trainer.num_nodes
    if world > 1 or job.strategy.name in (StrategyName.fsdp, StrategyName.deepspeed):
        raise ValueError(f"{key} needs one process (trainer.devices=1): {world} process(es), "
                         f"strategy={job.strategy.name.value}; set trainer.devices=1 trainer.num_nodes=1 "
                         "strategy=auto or trainer.curve_every_n_steps=null")


def register_train_schema() -> None:
    """Store :class:`TrainJobConfig` as ``train_schema`` in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="train_schema", node=TrainJobConfig)


def load_job(cfg: DictConfig) -> TrainJobConfig:
    """The composed config as the typed job: converted once, every ``__post_init__`` check run.

    Raises:
        UserError: an unknown key (also one added with ``+``) or a value out of range (naming the key and the fix).
    """
    return to_job(cfg, TrainJobConfig)
