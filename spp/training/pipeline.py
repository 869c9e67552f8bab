"""The training job: compose → load → prune (setup callback) → SPP → fit → merge → audit → eval → export."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from spp.training.callbacks.adapter_checkpoint import AdapterCheckpoint, resolve_resume
from spp.training.callbacks.export import ExportCallback
from spp.training.callbacks.pruning import PruningCallback
from spp.training.callbacks.sparsity_audit import SparsityAuditCallback
from spp.training.config import validate_job
from spp.training.loggers import build_loggers, finish_wandb, log_final_metrics, run_tags
from spp.training.module import SPPModule
from spp.training.resumable import ResumableLoader, ResumeLoaderCallback, trainer_position
from spp.training.strategies import build_strategy, is_sharded
from spp.training.summary import print_results, save_and_print_config, versions, write_summary

log = logging.getLogger(__name__)


def resolve_run_dir(cfg: DictConfig) -> Path:
    """``run_dir`` from the config, else Hydra's job output directory, else ``outputs/train``."""
    if cfg.run_dir:
        return Path(cfg.run_dir).expanduser().resolve()
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs/train").resolve()


def resolve_precision(precision: str, accelerator: str) -> str:
    """``auto`` → ``bf16-mixed`` on a CUDA GPU with bf16 support, else ``32-true`` (CPU)."""
    if precision != "auto":
        return precision
    on_gpu = accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
    return "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"


def world_size(devices: Any, num_nodes: int, accelerator: str) -> int:
    """Processes Lightning will start for ``trainer.devices`` × ``trainer.num_nodes``."""
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        per_node = len(devices)
    elif str(devices) in ("auto", "-1"):
        per_node = torch.cuda.device_count() if accelerator != "cpu" and torch.cuda.is_available() else 1
    else:
        per_node = int(devices)
    return max(1, per_node) * num_nodes


def accumulation(cfg: DictConfig) -> int:
    """Gradient-accumulation steps: ``global_batch_size / (per-device batch × world size)``.

    Raises:
        ValueError: the global batch is not a multiple of per-device batch × world size (names the keys).
    """
    tcfg = cfg.trainer
    if tcfg.global_batch_size is None:
        return int(tcfg.accumulate_grad_batches)
    per_step = int(cfg.data.train_batch_size) * world_size(tcfg.devices, tcfg.num_nodes, tcfg.accelerator)
    if tcfg.global_batch_size % per_step:
        raise ValueError(
            f"trainer.global_batch_size={tcfg.global_batch_size} is not a multiple of data.train_batch_size "
            f"({cfg.data.train_batch_size}) × world size ({per_step // int(cfg.data.train_batch_size)})"
        )
    return tcfg.global_batch_size // per_step


def _validate(cfg: DictConfig) -> None:
    """Schema-level range checks of every group (each names its config key)."""
    validate_job(cfg)
    needs_gpu = cfg.strategy.name in ("fsdp", "deepspeed")
    if needs_gpu and (cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available()):
        raise ValueError(
            f"strategy={cfg.strategy.name} needs CUDA GPUs (Lightning runs FSDP/DeepSpeed on GPUs only); use "
            "strategy=ddp (gloo on CPU) or strategy=auto here, or run on a GPU machine with trainer.accelerator=gpu"
        )
    for group in ("pruner", "sparsity", "calibration", "data"):
        node = OmegaConf.to_object(cfg[group])
        if hasattr(node, "validate"):
            node.validate()


def _progress_bar(kind: str) -> list[Callback]:
    if kind == "rich":
        return [RichProgressBar(leave=True)]
    if kind == "tqdm":
        return [TQDMProgressBar()]
    return []


def _loss_summary(train: list[float], val: list[float], steps: int) -> dict[str, Any]:
    k = max(1, min(10, len(train) // 4))
    return {
        "train_first": sum(train[:k]) / k if train else None,
        "train_last": sum(train[-k:]) / k if train else None,
        "averaged_over": k,
        "train": train,
        "val": val,
        "optimizer_steps": steps,
    }


def run_training(cfg: DictConfig, extra_callbacks: list[Callback] | None = None) -> dict[str, Any]:
    """Run one training job described by a composed ``train`` config.

    Args:
        cfg: The composed :class:`spp.training.config.TrainJobConfig` (``conf/train.yaml``).
        extra_callbacks: More Lightning callbacks (tests use one to interrupt a run).

    Returns:
        The summary dict written to ``<run_dir>/summary.json`` (on global rank 0; other ranks get a small
        dict with ``run_dir``).
    """
    from spp.data import AlpacaDataModule
    from spp.models import load_model

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    _validate(cfg)
    L.seed_everything(cfg.seed, workers=True)
    run_dir = resolve_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    if rank_zero_only.rank == 0:
        save_and_print_config(cfg, run_dir, show=cfg.print_config)
    adapter = OmegaConf.to_container(cfg.adapter, resolve=True)
    tcfg = cfg.trainer

    start = time.perf_counter()
    model, tokenizer = load_model(cfg.model)
    timings["load_model"] = round(time.perf_counter() - start, 2)
    datamodule = AlpacaDataModule(tokenizer, cfg.data, data_dir=cfg.data_dir, progress=tcfg.progress_bar != "none")
    make_loader = datamodule.train_dataloader
    pending: dict[str, int] = {}
    module = SPPModule(
        model,
        adapter,
        lr=tcfg.lr,
        weight_decay=tcfg.weight_decay,
        betas=tuple(tcfg.betas),
        warmup_ratio=tcfg.warmup_ratio,
        scheduler=tcfg.scheduler,
        gradient_checkpointing=tcfg.gradient_checkpointing,
        compile_model=tcfg.compile,
    )
    strategy = build_strategy(cfg.strategy, cfg.model.decoder_layer_cls, tcfg.accelerator)
    pruning = PruningCallback(
        tokenizer, cfg.model, cfg.pruner, cfg.sparsity, cfg.calibration, cfg.cache_dir, cfg.data_dir,
        eval_cfg=cfg.eval, dense_ppl=cfg.dense_ppl, pruned_ppl=cfg.pruned_ppl,
    )
    auditor = SparsityAuditCallback(lambda: pruning.masks, enabled=lambda trainer: not is_sharded(trainer.strategy))

    def rebuild() -> torch.nn.Module:
        from spp.adapters import AdapterConfig, apply_adapter

        fresh, _ = load_model(cfg.model, with_tokenizer=False)
        return apply_adapter(fresh, AdapterConfig(**adapter), {})[0]

    extra = {"pruning": {"pruner": cfg.pruner.name, "sparsity": cfg.sparsity.name, "model": cfg.model.name}}
    exporter = ExportCallback(
        run_dir, tokenizer, adapter, lambda: pruning.masks, lambda: auditor.reference, eval_cfg=cfg.eval,
        data_dir=cfg.data_dir, export_merged=cfg.export.merged, export_adapter=cfg.export.adapter,
        max_shard_size=cfg.export.max_shard_size, rebuild=rebuild, adapter_extra=extra,
    )
    checkpoint = AdapterCheckpoint(run_dir / "checkpoints", tcfg.checkpoint_every_n_steps, tcfg.save_top_k)
    callbacks: list[Callback] = [pruning, auditor, checkpoint, exporter, LearningRateMonitor("step")]
    callbacks += _progress_bar(tcfg.progress_bar) + list(extra_callbacks or [])
    callbacks.append(ResumeLoaderCallback(pending))
    loggers = build_loggers(cfg, run_dir)
    trainer = L.Trainer(
        accelerator=tcfg.accelerator,
        devices=tcfg.devices,
        num_nodes=tcfg.num_nodes,
        strategy=strategy,
        precision=resolve_precision(tcfg.precision, tcfg.accelerator),
        max_epochs=tcfg.max_epochs,
        max_steps=tcfg.max_steps,
        accumulate_grad_batches=accumulation(cfg),
        gradient_clip_val=tcfg.gradient_clip_val,
        val_check_interval=tcfg.val_check_interval,
        limit_val_batches=tcfg.limit_val_batches,
        num_sanity_val_steps=tcfg.num_sanity_val_steps,
        log_every_n_steps=tcfg.log_every_n_steps,
        deterministic=tcfg.deterministic,
        enable_progress_bar=tcfg.progress_bar != "none",
        enable_model_summary=False,
        callbacks=callbacks,
        logger=loggers,
        default_root_dir=str(run_dir),
    )
    datamodule.train_dataloader = lambda: ResumableLoader(make_loader(), lambda: trainer_position(trainer), pending)
    start = time.perf_counter()
    try:
        if adapter["name"] == "none":
            _prune_and_export_only(trainer, module, datamodule, pruning, auditor, exporter)
        else:
            resume = resolve_resume(tcfg.resume_from, Path(checkpoint.dirpath))
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
        timings["fit_call"] = round(time.perf_counter() - start, 2)
        if not trainer.is_global_zero:
            return {"run_dir": str(run_dir)}
        timings["train"] = round(module.train_seconds, 2)
        timings.update({f"pruning_{k}": v for k, v in pruning.seconds.items()})
        timings.update({f"export_{k}": v for k, v in exporter.results.get("timings", {}).items()})
        timings["total"] = round(time.perf_counter() - t0, 2)
        summary = build_summary(cfg, run_dir, module, datamodule, pruning, auditor, exporter, trainer, timings)
        log_final_metrics(loggers, summary, step=trainer.global_step)
    finally:
        finish_wandb()
    write_summary(run_dir, summary)
    print_results(summary)
    return summary


def _prune_and_export_only(
    trainer: L.Trainer,
    module: SPPModule,
    datamodule: Any,
    pruning: PruningCallback,
    auditor: SparsityAuditCallback,
    exporter: ExportCallback,
) -> None:
    """``adapter=none``: prune (through the cache), audit, evaluate and export without a training loop."""
    datamodule.setup("fit")
    pruning.setup(trainer, module, "fit")
    module.configure_model()
    auditor.on_fit_start(trainer, module)
    exporter.results = exporter.export(module.model, device=trainer.strategy.root_device)


def build_summary(
    cfg: DictConfig,
    run_dir: Path,
    module: SPPModule,
    datamodule: Any,
    pruning: PruningCallback,
    auditor: SparsityAuditCallback,
    exporter: ExportCallback,
    trainer: L.Trainer,
    timings: dict[str, float],
) -> dict[str, Any]:
    """Everything a table or plot needs from this job (written to ``summary.json``)."""
    masks = pruning.masks
    kept = sum(int(m.sum()) for m in masks.values())
    total = sum(m.numel() for m in masks.values())
    results = exporter.results
    ids = run_tags(cfg)
    merged_audit = [{"when": "merged", **results["audit_merged"]}] if "audit_merged" in results else []
    prune_result = pruning.result
    report = getattr(prune_result, "report", None)
    return {
        "run": {
            "name": ids["name"], "group": ids["group"], "tags": ids["tags"], "run_dir": str(run_dir),
            "model": cfg.model.name, "pruner": cfg.pruner.name, "sparsity": cfg.sparsity.name,
            "adapter": cfg.adapter.name, "r": cfg.adapter.r,
        },
        "perplexity": {
            "dense": pruning.ppl.get("dense"), "pruned": pruning.ppl.get("pruned"), "merged": results.get("ppl_merged"),
        },
        "zero_shot": results.get("zero_shot"),
        "sparsity": {
            "target": OmegaConf.to_object(cfg.sparsity).target_ratio,
            "before": (total - kept) / total if total else 0.0,
            "after": results.get("audit_merged", {}).get("sparsity"),
            "audits": auditor.reports + merged_audit,
        },
        "params": module.param_counts,
        "losses": _loss_summary(module.train_losses, module.val_losses, trainer.global_step),
        "data": datamodule.summary() if datamodule.train_dataset is not None else None,
        "pruning": {
            "cache_hit": getattr(prune_result, "cache_hit", None),
            "timings": getattr(prune_result, "timings", None),
            "report": getattr(report, "overall", None),
        },
        "merge": results.get("merge_stats"),
        "timings": timings,
        "outputs": {
            "merged_dir": results.get("merged_dir"), "adapter_dir": results.get("adapter_dir"),
            "checkpoints": str(run_dir / "checkpoints"), "summary": str(run_dir / "summary.json"),
            "resolved_config": str(run_dir / "resolved_config.yaml"),
        },
        "config": OmegaConf.to_container(cfg, resolve=True),
        "versions": versions(),
    }
