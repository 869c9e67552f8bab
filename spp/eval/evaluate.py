"""One evaluation (perplexity and lm-eval tasks) for ``train.py``'s export and ``eval.py``, spread over replicas.

A replica is the fewest GPUs that hold the model (the run's plan, ``docs/plan.md``): a model spread with
``device_map`` runs its GPUs one after the other, while replicas run side by side."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.distributed import DistContext, local_world_size
from spp.errors import UserError
from spp.eval.config import EvalConfig
from spp.eval.distributed_lm import IN_MEMORY, load_replica_model
from spp.eval.doc_records import DOC_RECORDS_FILE, doc_records, majority_class
from spp.eval.harness import run_eval_tasks
from spp.eval.ppl_cache import ppl_settings
from spp.eval.replicas import ReplicaGroup, replica_devices, replica_perplexity
from spp.generation import generate_text
from spp.planning.folder import placement_of_folder

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """What :func:`evaluate` measured (the same on every process).

    ``ppl`` is ``PerplexityResult.to_dict()`` + ``seconds``; ``sample`` a greedy completion by global rank 0;
    ``seconds`` wall time by part; with ``eval.log_samples``, ``doc_records`` holds one record per scored document
    and ``zero_shot`` also ``majority_class``."""

    ppl: dict[str, Any] | None = None
    ppl_by_source: dict[str, dict[str, Any]] = field(default_factory=dict)
    zero_shot: dict[str, Any] | None = None
    task_versions: dict[str, Any] = field(default_factory=dict)
    sample: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    placement: dict[str, Any] = field(default_factory=dict)
    doc_records: list[dict[str, Any]] | None = None

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` keeps of how the evaluation ran."""
        return {"placement": self.placement, "seconds": self.seconds}


def gpus_per_replica(eval_cfg: EvalConfig, source: str | Path | nn.Module, ctx: DistContext) -> int:
    """``eval.gpus_per_replica``, else the plan's fewest GPUs of this node that hold the model with its evaluation
    batch; 1 on CPUs and for an in-memory model."""
    if eval_cfg.gpus_per_replica is not None:
        return int(eval_cfg.gpus_per_replica)
    device = torch.device(eval_cfg.device) if eval_cfg.device else ctx.device
    if device.type != "cuda" or isinstance(source, nn.Module):
        return 1
    per_node = local_world_size(ctx.world)
    memory = torch.cuda.get_device_properties(device).total_memory
    placement = placement_of_folder(source, int(eval_cfg.seqlen), int(eval_cfg.batch_size),
                                    int(eval_cfg.lm_eval_batch_size), memory, per_node, max(1, ctx.world // per_node))
    if placement.how == "cpu":
        raise UserError(f"evaluation cannot place the model on this node's GPUs: {placement.reason}",
                        "set eval.gpus_per_replica= (and eval.max_memory_per_gpu=) by hand, or evaluate on a node with "
                        "more GPU memory", key="eval.gpus_per_replica")
    return placement.gpus_per_replica


def evaluate(source: str | os.PathLike[str] | nn.Module, eval_cfg: EvalConfig, ctx: DistContext | None = None, *,
             tokenizer: Any = None, data_dir: str | os.PathLike[str] | None = None,
             sample: tuple[str, int] | None = None, label: str = "model",
             on_perplexity: Callable[[Evaluation], None] | None = None) -> Evaluation:
    """Perplexity and lm-eval tasks of ``source`` (a saved model folder, or an in-memory model in one process).

    Every process of ``ctx`` must call it and gets the same :class:`Evaluation`; ``sample`` is the
    ``(prompt, max_new_tokens)`` of a greedy completion by global rank 0. ``on_perplexity`` gets global rank 0's
    evaluation so far once the perplexities are measured and lm-eval tasks follow (``eval.py`` writes it, so a job
    stopped by a time limit during the tasks keeps them)."""
    ctx = ctx or DistContext()
    source = source if isinstance(source, nn.Module) else Path(source)
    replicas = ReplicaGroup.create(ctx, gpus_per_replica(eval_cfg, source, ctx))
    result = None
    if replicas.is_leader:
        result = _measure(source, eval_cfg, replicas, tokenizer, data_dir, sample, label, on_perplexity)
    return replicas.share(result)


def _load(source: Path | nn.Module, eval_cfg: EvalConfig, replicas: ReplicaGroup,
          tokenizer: Any) -> tuple[nn.Module, Any, dict[str, Any]]:
    """This leader's model (loaded over its replica's GPUs, or the CPU), tokenizer and lm-eval model arguments."""
    if isinstance(source, nn.Module):
        return source, tokenizer, {"pretrained": IN_MEMORY, "device": str(next(source.parameters()).device)}
    from transformers import AutoTokenizer

    device = eval_cfg.device or str(replicas.ctx.device)
    gpus = [] if torch.device(device).type != "cuda" else replica_devices(replicas, device=torch.device(device))
    model, args = load_replica_model(source, gpus, device if not gpus else None,
                                     max_memory_per_gpu=eval_cfg.max_memory_per_gpu)
    return model, tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(source), args


def _measure(source: Path | nn.Module, eval_cfg: EvalConfig, replicas: ReplicaGroup, tokenizer: Any,
             data_dir: Any, sample: tuple[str, int] | None, label: str,
             on_perplexity: Callable[[Evaluation], None] | None = None) -> Evaluation:
    """A leader's share of the evaluation (replica 0's result is the one every process gets)."""
    start = time.perf_counter()
    model, tokenizer, args = _load(source, eval_cfg, replicas, tokenizer)
    out = Evaluation(seconds={"load": round(time.perf_counter() - start, 2)},
                     placement=replicas.placement({**args, "batch_size": eval_cfg.lm_eval_batch_size}))
    main = replicas.ctx.is_main
    if eval_cfg.ppl:
        for src in [eval_cfg.ppl_source, *eval_cfg.extra_ppl_sources]:
            t0 = time.perf_counter()
            res = replica_perplexity(model, tokenizer, replicas, data_dir=data_dir,
                                     **{**ppl_settings(eval_cfg), "source": src})
            seconds = round(time.perf_counter() - t0, 2)
            out.ppl_by_source[src] = {**res.to_dict(), "seconds": seconds, "cache_hit": False}
            out.seconds[f"ppl_{src}"] = seconds
            if main:
                log.info("%s perplexity (%s): %.2f (seqlen %d, %d windows, %d replica(s); %.1f s)", label, src,
                         res.ppl, res.seqlen, res.windows, replicas.count, seconds)
        out.ppl = out.ppl_by_source[eval_cfg.ppl_source]
        if eval_cfg.tasks and main and on_perplexity is not None:
            on_perplexity(out)
    if eval_cfg.tasks:
        _tasks(model, tokenizer, eval_cfg, replicas, data_dir, out, label)
    if sample is not None and main:
        t0 = time.perf_counter()
        out.sample = generate_text(model, tokenizer, sample[0], max_new_tokens=sample[1]).summary()
        out.seconds["sample"] = round(time.perf_counter() - t0, 2)
        log.info("%s completion: %r", label, out.sample.get("completion"))
    return out


def _tasks(model: nn.Module, tokenizer: Any, eval_cfg: EvalConfig, replicas: ReplicaGroup, data_dir: Any,
           out: Evaluation, label: str) -> None:
    """``eval.tasks`` through lm-eval, documents split over the replicas; fills ``out.zero_shot``."""
    t0 = time.perf_counter()
    harness = run_eval_tasks(model, tokenizer, eval_cfg, data_dir, replicas=replicas)
    out.zero_shot = {"metrics": harness.metrics, "zero_shot_mean": harness.zero_shot_mean,
                     "mmlu_acc": harness.mmlu_acc, "limit": harness.limit, "mmlu_limit": eval_cfg.mmlu_limit,
                     "num_fewshot": harness.num_fewshot}
    out.task_versions = dict(harness.raw.get("versions", {}))
    if "samples" in harness.raw:
        out.doc_records = doc_records(harness.raw["samples"])
        out.zero_shot.update(majority_class=majority_class(out.doc_records), documents=DOC_RECORDS_FILE)
    out.seconds["zero_shot"] = round(time.perf_counter() - t0, 2)
    if replicas.ctx.is_main:
        log.info("%s: eval tasks %s: zero-shot mean %s, MMLU %s (%.1f s)", label, list(eval_cfg.tasks),
                 harness.zero_shot_mean, harness.mmlu_acc, out.seconds["zero_shot"])
