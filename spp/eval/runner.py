"""What ``eval.py`` does: check every input, load (prune, adapt) the model, measure, write and log the results."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.loggers import Logger

from spp.adapters.registry import describe_dir, load_adapter_dir
from spp.atomic import check_writable_dir
from spp.distributed import launch_processes
from spp.errors import UserError
from spp.eval.adapter_base import check_adapter_base
from spp.eval.doc_records import DOC_RECORDS_FILE, write_doc_records
from spp.eval.evaluate import Evaluation, evaluate
from spp.eval.harness import task_data_files
from spp.eval.job_config import EvalJobConfig
from spp.eval.perplexity import check_seqlen, source_file
from spp.eval.run_name import run_origin
from spp.eval.tables import EvalRecord, log_to_loggers, write_results
from spp.export.manifest import ExportManifest
from spp.loggers import (
    build_loggers,
    config_record,
    finish_wandb,
    log_final_metrics,
    log_perplexity_table,
    run_tags,
)
from spp.models.config import ModelConfig
from spp.models.loading import check_tokenizer_files, load_config, load_model, resolve_source
from spp.paths import data_provenance, forget_data_reads
from spp.planning.shapes import arch_config
from spp.projections import DEFAULT_TARGETS, find_projections, in_blocks
from spp.pruning.calibration_data import check_calibration_source
from spp.pruning.patterns import sparsity_summary
from spp.pruning.reconstruction.phase import get_or_reconstruct
from spp.pruning.registry import needs_calibration

log = logging.getLogger(__name__)


def context_length(model_cfg: ModelConfig) -> int | None:
    """The model's ``max_position_embeddings`` read without loading weights (``None`` when unknown)."""
    if resolve_source(model_cfg)[0] in ("tiny", "dir"):  # transformers' config: GPT-2 names it n_positions
        value = getattr(load_config(model_cfg), "max_position_embeddings", None)
    else:  # a hub id's arch, named as its family's config names it (GPT-2: n_positions); no family default
        arch = dict(model_cfg.arch or {})
        own = getattr(arch_config(arch), "attribute_map", {}).get("max_position_embeddings") if arch else None
        value = arch.get(own, arch.get("max_position_embeddings"))
    return int(value) if value is not None else None


def wants_pruning(cfg: EvalJobConfig) -> bool:
    """Whether the job prunes: pruner and sparsity both set (one without the other raises ``ValueError``)."""
    pruner, dense = cfg.pruner.name, cfg.sparsity.kind == "dense"
    if pruner == "none" and not dense:
        raise ValueError(f"sparsity={cfg.sparsity.name} needs a pruner: add pruner=wanda (or magnitude, sparsegpt)")
    if pruner != "none" and dense:
        raise ValueError(f"pruner={pruner} needs a sparsity pattern: add sparsity=nm2_4 (or unstructured50, ...)")
    return pruner != "none"


def preflight(cfg: EvalJobConfig) -> None:
    """Check what needs the file system before any model is loaded (context length, data files, adapter directory);
    value ranges are the config dataclasses' job."""
    wants_pruning(cfg)
    check_tokenizer_files(cfg.model, takes_tokenizer=False)
    max_pos = context_length(cfg.model)
    if cfg.eval.ppl:
        check_seqlen(int(cfg.eval.seqlen), max_pos)
        for source in [cfg.eval.ppl_source, *cfg.eval.extra_ppl_sources]:
            source_file(source, cfg.data_dir)
    if cfg.eval.tasks and not cfg.eval.online:
        task_data_files(list(cfg.eval.tasks), cfg.data_dir)
    if cfg.reconstruct.enabled and not wants_pruning(cfg):
        raise UserError("reconstruct=blockwise reconstructs the model this job prunes, but it prunes nothing",
                        "set pruner= and sparsity= as the run did (or reconstruct=none)", key="reconstruct")
    if cfg.adapter_dir:
        describe_dir(cfg.adapter_dir)  # a folder an adapter method wrote, its files whole
        check_adapter_base(cfg, wants_pruning(cfg))  # on the model and pruning it records
    if wants_pruning(cfg) and needs_calibration(cfg.pruner, cfg.sparsity):  # the source supplies the windows
        check_calibration_source(cfg.calibration, cfg.data_dir, cfg.model)
    if cfg.use_cache and wants_pruning(cfg):
        check_writable_dir(Path(cfg.cache_dir).expanduser() / "pruning", "cache_dir",
                           "point cache_dir= (or SPP_CACHE_DIR) at a directory you can write to, or use_cache=false",
                           value=cfg.cache_dir)


def default_label(cfg: EvalJobConfig) -> str:
    """``<model> <pruner> <sparsity>[ +adapter]`` of :func:`~spp.eval.run_name.run_origin` (an export's recorded
    run first); a local model directory is named by its folder."""
    origin = run_origin(cfg.model.path, cfg.model.name, cfg.pruner.name, cfg.sparsity.name)
    name = origin["model"]
    local = Path(cfg.model.path).expanduser()
    if local.is_dir():
        name = f"{name}:{local.name}"
    label = name if origin["pruner"] == "none" else f"{name} {origin['pruner']} {origin['sparsity']}"
    return label + (" +adapter" if cfg.adapter_dir else "")


def linear_sparsity(model: torch.nn.Module) -> float:
    """Fraction of exact zeros over the weights of every linear projection inside the decoder blocks."""
    weights = {name: module.weight for name, module in find_projections(model, DEFAULT_TARGETS).items()}
    return sparsity_summary(weights)["overall"]["sparsity"]


def is_folder(cfg: EvalJobConfig) -> bool:
    """Whether the job evaluates a saved model folder as it is (``model.path=<dir>``, no pruning, no adapter): the
    case that runs on N processes (each replica loads the folder)."""
    if wants_pruning(cfg) or cfg.adapter_dir:
        return False
    kind, _where, gguf_file = resolve_source(cfg.model)
    return kind == "dir" and not gguf_file


def folder_sparsity(path: Path) -> float:
    """Exact-zero share of the decoder blocks' 2-D weights of a saved folder: its ``spp_export.json`` audit when it
    has one, else read one tensor at a time."""
    manifest = ExportManifest.read(path)
    if manifest is not None and manifest.audit.get("sparsity") is not None:
        return float(manifest.audit["sparsity"])
    from safetensors import safe_open

    zeros = total = 0
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            for key in fh.keys():
                if in_blocks(key) and key.endswith(".weight") and len(fh.get_slice(key).get_shape()) == 2:
                    weight = fh.get_tensor(key)
                    zeros, total = zeros + int((weight == 0).sum()), total + weight.numel()
    return zeros / total if total else 0.0


def _in_memory(cfg: EvalJobConfig, info: dict[str, Any]) -> tuple[torch.nn.Module, Any]:
    """Load, prune (through the cache) and adapt the model in this process, for a job that is not a folder."""
    device = torch.device(cfg.eval.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, tokenizer = load_model(cfg.model)
    model.to(device)
    masks: dict[str, torch.Tensor] = {}
    if wants_pruning(cfg):
        start = time.perf_counter()
        result, rebuilt = get_or_reconstruct(model, tokenizer, cfg.model, cfg.pruner, cfg.sparsity, cfg.calibration,
                                             cfg.reconstruct, cfg.cache_dir if cfg.use_cache else None, cfg.data_dir,
                                             device, lock_timeout_s=cfg.cache_lock_timeout_s)
        if rebuilt is not None:
            info["reconstruction"] = rebuilt.summary()
        info["timings"]["prune"] = round(time.perf_counter() - start, 2)
        info["cache_hit"] = result.cache_hit
        info["prune_overall"] = result.report.overall
        masks = result.masks
    if cfg.adapter_dir:  # loaded and merged by the method that wrote it, as the run's merged export holds it
        model, info["adapter"] = load_adapter_dir(model, cfg.adapter_dir, masks)
        model.to(device)
    info["linear_sparsity"] = linear_sparsity(model)
    return model, tokenizer


def run_eval_job(cfg: EvalJobConfig, output_dir: str | Path) -> EvalRecord | None:
    """Evaluate the model ``cfg`` describes and write ``results.json`` / ``results.md`` into ``output_dir``.

    A saved folder is evaluated by every process of the job; a model pruned or adapted here in this process. Returns
    the record (one table row) on global rank 0, ``None`` elsewhere."""
    forget_data_reads()  # a multirun's jobs share the process: each records the files it reads
    preflight(cfg)
    ctx = launch_processes(cfg.accelerator, cfg.devices, cfg.num_nodes, cfg.eval.device)
    folder = is_folder(cfg)
    if ctx.distributed and not folder:
        raise UserError(f"eval.py on {ctx.world} processes evaluates a saved model folder (model.path=<dir>), not a "
                        "model pruned or adapted here", "run it on one process (devices=1), or evaluate the folder "
                        "train.py or prune.py wrote", key="devices")
    info: dict[str, Any] = {"model_path": cfg.model.path, "pruner": cfg.pruner.name, "sparsity": cfg.sparsity.name,
                            "adapter_dir": cfg.adapter_dir, "timings": {}}
    start = time.perf_counter()
    if folder:
        source, tokenizer = Path(cfg.model.path).expanduser(), None
        info["linear_sparsity"] = folder_sparsity(source) if ctx.is_main else None
    else:
        source, tokenizer = _in_memory(cfg, info)
    info["timings"]["load"] = round(time.perf_counter() - start, 2)
    label = cfg.label or default_label(cfg)
    ev = evaluate(source, cfg.eval, ctx, tokenizer=tokenizer, data_dir=cfg.data_dir, label=label,
                  on_perplexity=lambda part: _write(cfg, output_dir, label, info, part, partial=True))
    return _write(cfg, output_dir, label, info, ev) if ctx.is_main else None


PARTIAL_STATUS = "partial: the perplexity is measured, the lm-eval tasks had not ended when this was written"
"""``info.status`` of the ``results.json`` written between the perplexity and the lm-eval tasks (a job stopped by
a time limit during the tasks keeps it); the finished job's record has no ``status``."""


def _write(cfg: EvalJobConfig, output_dir: str | Path, label: str, info: dict[str, Any], ev: Evaluation,
           partial: bool = False) -> EvalRecord:
    """Rank 0: the record of ``ev``, written to ``results.json`` / ``results.md`` and (when not ``partial``) the
    loggers."""
    info.pop("status", None)
    if partial:
        info["status"] = PARTIAL_STATUS
    record = EvalRecord(label=label, limit=cfg.eval.limit, info=info)
    record.ppl = {src: {k: v for k, v in entry.items() if k not in ("seconds", "cache_hit")}
                  for src, entry in ev.ppl_by_source.items()}
    info["timings"].update({k if k != "zero_shot" else "lm_eval": v for k, v in ev.seconds.items() if k != "load"})
    info["evaluation"] = ev.record()
    if ev.zero_shot is not None:
        record.tasks = ev.zero_shot["metrics"]
        info["mmlu_limit"] = cfg.eval.mmlu_limit if cfg.eval.mmlu_limit is not None else cfg.eval.limit
        info["num_fewshot"] = ev.zero_shot["num_fewshot"]
        info["doc_seed"] = cfg.eval.doc_seed  # eval.limit's seeded random sample of documents (results.md says so)
        info["task_versions"] = ev.task_versions
        if ev.doc_records is not None:
            info["majority_class"] = ev.zero_shot["majority_class"]
            info["documents"] = write_doc_records(Path(output_dir) / DOC_RECORDS_FILE, ev.doc_records).name
    info["data_files"] = data_provenance()
    meta = {"config": dataclasses.asdict(cfg), "data_files": info["data_files"]}
    title = f"Evaluation: {record.label}" + (" (partial: perplexity only, the lm-eval tasks had not ended)"
                                              if partial else "")
    write_results(output_dir, [record], meta, title=title)
    if not partial:
        log_record(cfg, output_dir, record)
    return record


def job_loggers(cfg: EvalJobConfig, output_dir: str | Path) -> list[Logger]:
    """The job's loggers; the run is named and tagged by :func:`spp.eval.run_name.run_origin` (as the output folder
    is) like the training run it evaluates (``<model>-<pruner>-<sparsity>-<adapter>-r<r>``, plus the tag ``eval``);
    its W&B config is the resolved job config with ``origin``."""
    origin = run_origin(cfg.model.path, cfg.model.name, cfg.pruner.name, cfg.sparsity.name, cfg.adapter_dir)
    ids = run_tags(origin["model"], origin["pruner"], origin["sparsity"], origin["adapter"], origin["r"],
                   cfg.logger.wandb)
    ids["tags"] = list(dict.fromkeys([*ids["tags"], "eval"]))
    return build_loggers(cfg.logger, output_dir, ids, config_record(cfg, origin=origin))


def log_record(cfg: EvalJobConfig, output_dir: str | Path, record: EvalRecord) -> None:
    """Log the record to the job's loggers (:func:`job_loggers`): its metrics and the Table-2 table, each
    perplexity's interval (``eval/ppl/<source>_ci_low`` / ``_ci_high``, and the W&B table ``eval/perplexity``), then
    close the W&B run (one per job in a multirun)."""
    loggers = job_loggers(cfg, output_dir)
    try:
        log_to_loggers(loggers, [record])
        intervals = {f"eval/ppl/{src}_{end}": float(entry[end]) for src, entry in record.ppl.items()
                     for end in ("ci_low", "ci_high") if entry.get(end) is not None}
        log_final_metrics(loggers, intervals, step=0)
        log_perplexity_table(loggers, "eval/perplexity", "source", record.ppl)
    finally:
        finish_wandb()
