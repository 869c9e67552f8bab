"""What ``eval.py`` does: check every input, load (prune, adapt) the model, measure, write and log the results."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.loggers import Logger

from spp.adapters.spp.io import load_adapter, read_adapter_config
from spp.atomic import check_writable_dir
from spp.eval.harness import run_eval_tasks, task_data_files
from spp.eval.job_config import EvalJobConfig
from spp.eval.perplexity import check_seqlen, perplexity, source_file
from spp.eval.tables import EvalRecord, log_to_loggers, write_results
from spp.loggers import build_loggers, run_tags
from spp.models.config import ModelConfig
from spp.models.loading import load_model, resolve_source
from spp.models.tiny import TINY_ARCH
from spp.paths import data_provenance
from spp.pruning import get_or_prune, prune_model

log = logging.getLogger(__name__)


def context_length(model_cfg: ModelConfig) -> int | None:
    """The model's ``max_position_embeddings`` read without loading weights (``None`` when unknown).

    Raises:
        FileNotFoundError: ``model.path`` is missing or a directory without weights.
    """
    kind, where, gguf_file = resolve_source(model_cfg)
    if kind == "tiny":
        return int({**TINY_ARCH, **dict(model_cfg.arch)}["max_position_embeddings"])
    if kind == "dir" and not gguf_file:
        value = json.loads((Path(where) / "config.json").read_text()).get("max_position_embeddings")
        return int(value) if value is not None else None
    value = dict(model_cfg.arch or {}).get("max_position_embeddings")
    return int(value) if value is not None else None


def wants_pruning(cfg: EvalJobConfig) -> bool:
    """Whether the job prunes (pruner and sparsity both set), after checking that they agree.

    Raises:
        ValueError: a pruner without a sparsity pattern, or a sparsity pattern without a pruner.
    """
    pruner, dense = cfg.pruner.name, cfg.sparsity.kind == "dense"
    if pruner == "none" and not dense:
        raise ValueError(f"sparsity={cfg.sparsity.name} needs a pruner: add pruner=wanda (or magnitude, sparsegpt)")
    if pruner != "none" and dense:
        raise ValueError(f"pruner={pruner} needs a sparsity pattern: add sparsity=nm2_4 (or unstructured50, ...)")
    return pruner != "none"


def preflight(cfg: EvalJobConfig) -> None:
    """Check every input before any model is loaded; each problem raises one clear error naming its key.

    Value ranges are already checked by the config dataclasses (``__post_init__``); this checks what needs the
    file system: the model's context length, the perplexity and task data files, the adapter directory.
    """
    wants_pruning(cfg)
    max_pos = context_length(cfg.model)
    if cfg.eval.ppl:
        check_seqlen(int(cfg.eval.seqlen), max_pos)
        for source in [cfg.eval.ppl_source, *cfg.eval.extra_ppl_sources]:
            source_file(source, cfg.data_dir)
    if cfg.eval.tasks and not cfg.eval.online:
        task_data_files(list(cfg.eval.tasks), cfg.data_dir)
    if cfg.adapter_dir:
        read_adapter_config(cfg.adapter_dir)
    if cfg.use_cache and wants_pruning(cfg):
        check_writable_dir(Path(cfg.cache_dir).expanduser() / "pruning", "cache_dir",
                           "point cache_dir= (or SPP_CACHE_DIR) at a directory you can write to, or use_cache=false",
                           value=cfg.cache_dir)


def default_label(cfg: EvalJobConfig) -> str:
    """``<model> <pruner> <sparsity>[ +adapter]``; a local model directory is named by its folder."""
    name = cfg.model.name
    local = Path(cfg.model.path).expanduser()
    if local.is_dir():
        name = f"{name}:{local.name}"
    label = name if cfg.pruner.name == "none" else f"{name} {cfg.pruner.name} {cfg.sparsity.name}"
    return label + (" +adapter" if cfg.adapter_dir else "")


def linear_sparsity(model: torch.nn.Module) -> float:
    """Fraction of exact zeros over the weights of every ``nn.Linear`` inside the decoder blocks."""
    zeros = total = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}":
            weight = module.weight
            zeros += int((weight == 0).sum())
            total += weight.numel()
    return zeros / total if total else 0.0


def _device(cfg: EvalJobConfig) -> torch.device:
    return torch.device(cfg.eval.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def run_eval_job(cfg: EvalJobConfig, output_dir: str | Path) -> EvalRecord:
    """Evaluate the model ``cfg`` describes and write ``results.json`` / ``results.md`` into ``output_dir``.

    Args:
        cfg: The typed job (``OmegaConf.to_object`` of the composed ``conf/evaluate.yaml``).
        output_dir: Run directory.

    Returns:
        The record written (one table row).
    """
    preflight(cfg)
    info: dict[str, Any] = {"model_path": cfg.model.path, "pruner": cfg.pruner.name, "sparsity": cfg.sparsity.name,
                            "adapter_dir": cfg.adapter_dir, "timings": {}}
    device = _device(cfg)
    start = time.perf_counter()
    model, tokenizer = load_model(cfg.model)
    model.to(device)
    info["timings"]["load"] = round(time.perf_counter() - start, 2)
    if wants_pruning(cfg):
        start = time.perf_counter()
        if cfg.use_cache:
            result = get_or_prune(model, tokenizer, cfg.model, cfg.pruner, cfg.sparsity, cfg.calibration,
                                  cfg.cache_dir, data_dir=cfg.data_dir, device=device)
        else:
            result = prune_model(model, tokenizer, cfg.pruner, cfg.sparsity, cfg.calibration,
                                 data_dir=cfg.data_dir, device=device)
        info["timings"]["prune"] = round(time.perf_counter() - start, 2)
        info["cache_hit"] = result.cache_hit
        info["prune_overall"] = result.report.overall
    if cfg.adapter_dir:
        model = load_adapter(model, cfg.adapter_dir).to(device)
    info["linear_sparsity"] = linear_sparsity(model)
    if cfg.eval.tasks:
        task_data_files(list(cfg.eval.tasks), cfg.data_dir)  # recorded for data_files (the harness resolves them too)
    record = EvalRecord(label=cfg.label or default_label(cfg), limit=cfg.eval.limit, info=info)
    if cfg.eval.ppl:
        for source in [cfg.eval.ppl_source, *cfg.eval.extra_ppl_sources]:
            start = time.perf_counter()
            res = perplexity(
                model, tokenizer, source=source, seqlen=int(cfg.eval.seqlen), max_windows=cfg.eval.max_windows,
                batch_size=int(cfg.eval.batch_size), data_dir=cfg.data_dir, device=device,
                sampling=cfg.eval.window_sampling,
            )
            record.ppl[source] = res.to_dict()
            info["timings"][f"ppl_{source}"] = round(time.perf_counter() - start, 2)
            log.info("%s perplexity %.3f (seqlen %d, %d windows)", source, res.ppl, res.seqlen, res.windows)
    if cfg.eval.tasks:
        start = time.perf_counter()
        harness = run_eval_tasks(model, tokenizer, cfg.eval, data_dir=cfg.data_dir)
        record.tasks = harness.metrics
        info["mmlu_limit"] = cfg.eval.mmlu_limit if cfg.eval.mmlu_limit is not None else cfg.eval.limit
        info["num_fewshot"] = harness.num_fewshot
        info["task_versions"] = harness.raw.get("versions", {})
        info["timings"]["lm_eval"] = round(time.perf_counter() - start, 2)
    info["data_files"] = data_provenance()
    meta = {"config": dataclasses.asdict(cfg), "data_files": info["data_files"]}
    write_results(output_dir, [record], meta, title=f"Evaluation: {record.label}")
    log_to_loggers(job_loggers(cfg, output_dir), [record])
    return record


def job_loggers(cfg: EvalJobConfig, output_dir: str | Path) -> list[Logger]:
    """The job's loggers; the run is named ``<model>-<pruner>-<sparsity>-<spp-r<r> | none>`` like a training run."""
    adapter, r = "none", None
    if cfg.adapter_dir:
        adapter, r = "spp", read_adapter_config(cfg.adapter_dir)["layer_kwargs"]["r"]
    ids = run_tags(cfg.model.name, cfg.pruner.name, cfg.sparsity.name, adapter, r, cfg.logger.wandb)
    return build_loggers(cfg.logger, output_dir, ids)
