"""Structured configs of the training groups and the typed top-level job of ``train.py``.

Groups owned here: ``adapter`` (spp, lora, none), ``trainer``, ``strategy``, ``logger`` (csv, wandb,
tensorboard, several at once), plus the ``experiment`` and ``debug`` presets (global packages, no schema of
their own). :func:`register_configs` stores the top-level :class:`TrainJobConfig` in Hydra's ConfigStore as
``train_schema`` so every group option is merged into a typed node and a misspelled key or a wrong type fails
at compose time with the key named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from spp.adapters.config import AdapterConfig
from spp.data.config import DataConfig
from spp.eval.config import EvalConfig
from spp.models.config import ModelConfig
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig

ADAPTER_KINDS = ("spp", "lora", "none")
SCHEDULERS = ("linear", "cosine", "constant")
STRATEGIES = ("auto", "ddp", "fsdp", "deepspeed")
PROGRESS_BARS = ("rich", "tqdm", "none")


@dataclass
class TrainerConfig:
    """Optimisation and Lightning ``Trainer`` settings (``conf/trainer/*.yaml``).

    ``lr`` and ``max_epochs`` default (in ``conf/train.yaml``) to the model group's paper values, and the
    per-device batch to ``model.per_device_batch_size`` through ``data.train_batch_size``.

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
        max_steps: Stop after this many optimiser steps (``-1`` = epochs decide).
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
        save_top_k: Adapter checkpoints kept (``-1`` = all); ``last.ckpt`` is always kept.
        resume_from: Checkpoint to resume (adapter, optimizer, scheduler, loops, position in the epoch): a
            ``.ckpt`` path, or ``last`` = ``<run_dir>/checkpoints/last.ckpt`` (pass the interrupted run's
            ``run_dir=`` too, since every Hydra run gets a new directory).
        progress_bar: ``rich``, ``tqdm`` or ``none``.
        deterministic: Lightning ``deterministic``.
    """

    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    precision: str = "auto"
    lr: float = 4e-3
    weight_decay: float = 0.001
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_ratio: float = 0.03
    scheduler: str = "linear"
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
    resume_from: str | None = None
    progress_bar: str = "rich"
    deterministic: bool = False


@dataclass
class StrategyConfig:
    """Distributed strategy (``conf/strategy/*.yaml``), built with Lightning's own strategy classes.

    Attributes:
        name: ``auto``, ``ddp``, ``fsdp`` or ``deepspeed``.
        process_group_backend: ``nccl`` / ``gloo``; ``None`` = ``gloo`` on CPU, Lightning's choice on GPU.
        find_unused_parameters: DDP ``find_unused_parameters``.
        sharding_strategy: FSDP sharding (``FULL_SHARD``, ``SHARD_GRAD_OP``, ``HYBRID_SHARD``, ``NO_SHARD``).
        use_orig_params: FSDP ``use_orig_params`` (lets frozen base weights and trainable SPP tensors share
            a wrapped unit without mixing ``requires_grad`` inside one flat parameter).
        wrap_decoder_layers: FSDP auto-wrap policy over ``model.decoder_layer_cls``.
        activation_checkpointing: FSDP activation checkpointing of ``model.decoder_layer_cls``.
        cpu_offload: FSDP parameter CPU offload.
        state_dict_type: FSDP checkpoint layout (``full`` or ``sharded``).
        stage: DeepSpeed ZeRO stage (2 or 3).
        offload_optimizer: DeepSpeed optimizer offload to CPU.
        offload_parameters: DeepSpeed parameter offload to CPU (stage 3).
    """

    name: str = "auto"
    process_group_backend: str | None = None
    find_unused_parameters: bool = False
    sharding_strategy: str = "FULL_SHARD"
    use_orig_params: bool = True
    wrap_decoder_layers: bool = True
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    state_dict_type: str = "full"
    stage: int = 2
    offload_optimizer: bool = False
    offload_parameters: bool = False


@dataclass
class CSVLoggerConfig:
    """Lightning ``CSVLogger`` under ``<run_dir>/<name>``."""

    name: str = "csv"
    flush_logs_every_n_steps: int = 50


@dataclass
class WandbLoggerConfig:
    """Weights & Biases logger; offline automatically without an API key.

    Attributes:
        project: W&B project.
        entity: W&B entity (team or user); ``None`` = the account default.
        name: Run name; ``None`` = ``<model>-<pruner>-<sparsity>-<adapter>-r<r>``.
        group: Run group; ``None`` = ``<model>-<pruner>-<sparsity>`` (a sweep over r shares a group).
        tags: Extra tags (model, pruner, sparsity, adapter and ``r<r>`` are always added).
        mode: ``auto`` (online when an API key is configured, else offline), ``online``, ``offline``,
            ``disabled``.
        log_model: Upload checkpoints as artifacts.
    """

    project: str = "spp"
    entity: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    mode: str = "auto"
    log_model: bool = False


@dataclass
class TensorBoardLoggerConfig:
    """Lightning ``TensorBoardLogger`` under ``<run_dir>/<name>`` (needs ``tensorboard`` or ``tensorboardX``)."""

    name: str = "tensorboard"


@dataclass
class LoggersConfig:
    """Which loggers run (``logger=csv``, ``logger=wandb`` or ``logger=[csv,wandb,tensorboard]``).

    A CSV logger is always added (its ``metrics.csv`` feeds the summary) even when ``csv`` is not chosen.
    """

    csv: CSVLoggerConfig | None = None
    wandb: WandbLoggerConfig | None = None
    tensorboard: TensorBoardLoggerConfig | None = None


@dataclass
class ExportConfig:
    """What is written at fit end (``export.*``).

    Attributes:
        merged: Write the merged sparse model + tokenizer with ``save_pretrained`` to ``<run_dir>/merged``.
        adapter: Write the adapter files (``adapter_config.json`` + ``adapter_model.safetensors``).
        max_shard_size: ``save_pretrained`` shard size.
    """

    merged: bool = True
    adapter: bool = True
    max_shard_size: str = "5GB"


@dataclass
class TrainJobConfig:
    """The typed top-level config of ``train.py`` (``conf/train.yaml``).

    Attributes:
        data_dir: Data root (else ``../shared/data`` when it exists, then the repo's ``data/``).
        seed: Global seed (model init of ``tiny``, dropout, shuffling).
        cache_dir: Pruning cache (a sweep over adapter settings prunes once).
        run_dir: Output directory; ``None`` = Hydra's job output directory (or ``outputs/train`` outside Hydra).
        dense_ppl: Measure the dense model's perplexity before pruning (cached).
        pruned_ppl: Measure the pruned model's perplexity before training (cached).
        print_config: Print the resolved config as a Rich tree.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)
    sparsity: SparsityConfig = field(default_factory=SparsityConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    logger: LoggersConfig = field(default_factory=LoggersConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    data_dir: str | None = None
    seed: int = 0
    cache_dir: str = "${oc.env:SPP_CACHE_DIR,${oc.env:HOME}/.cache/spp}"
    run_dir: str | None = None
    dense_ppl: bool = True
    pruned_ppl: bool = True
    print_config: bool = True


def register_configs() -> None:
    """Store :class:`TrainJobConfig` as ``train_schema`` in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="train_schema", node=TrainJobConfig)


def validate_job(cfg: Any) -> None:
    """Check value ranges that types cannot express, naming the key and the accepted values.

    Raises:
        ValueError: an unknown adapter, scheduler, strategy or progress bar, or an out-of-range number.
    """
    checks = [
        (cfg.adapter.name in ADAPTER_KINDS, f"adapter.name={cfg.adapter.name!r}: use one of {ADAPTER_KINDS}"),
        (cfg.adapter.r >= 1, f"adapter.r={cfg.adapter.r} must be >= 1"),
        (0.0 <= cfg.adapter.dropout < 1.0, f"adapter.dropout={cfg.adapter.dropout} must be in [0, 1)"),
        (len(cfg.adapter.targets) > 0, "adapter.targets is empty; list module-name suffixes such as q_proj"),
        (cfg.trainer.scheduler in SCHEDULERS, f"trainer.scheduler={cfg.trainer.scheduler!r}: use {SCHEDULERS}"),
        (0.0 <= cfg.trainer.warmup_ratio < 1.0, f"trainer.warmup_ratio={cfg.trainer.warmup_ratio} not in [0,1)"),
        (cfg.trainer.lr > 0, f"trainer.lr={cfg.trainer.lr} must be > 0"),
        (cfg.trainer.accumulate_grad_batches >= 1, "trainer.accumulate_grad_batches must be >= 1"),
        (
            cfg.trainer.progress_bar in PROGRESS_BARS,
            f"trainer.progress_bar={cfg.trainer.progress_bar!r}: use one of {PROGRESS_BARS}",
        ),
        (cfg.strategy.name in STRATEGIES, f"strategy.name={cfg.strategy.name!r}: use one of {STRATEGIES}"),
        (cfg.strategy.stage in (2, 3), f"strategy.stage={cfg.strategy.stage}: DeepSpeed ZeRO stage 2 or 3"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
