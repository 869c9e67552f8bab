"""What a training job hands its loggers beyond per-step metrics: the resolved config, the perplexity table and
the adapter (and merged model) as W&B artifacts named by the pruning cache key (``docs/wandb.md``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger

from spp.loggers import RunIds, config_record, log_folder_artifact, log_perplexity_table, wandb_loggers
from spp.training.run import Run


def identity_record(run: Run) -> dict[str, Any]:
    """The pruned base's identity: the model's identity and the pruning (and reconstruction) cache keys' digests
    (``None`` when nothing is pruned / reconstructed)."""
    ident = run.identity
    return {"model_identity": ident.model, "pruning_cache_key": ident.digest,
            "reconstruction_cache_key": ident.reconstruction[1] if ident.reconstruction is not None else None}


def logged_config(run: Run) -> dict[str, Any]:
    """W&B's ``run.config`` of a training job: the resolved job config and ``identity`` (:func:`identity_record`)."""
    return config_record(run.job, identity=identity_record(run))


def artifact_metadata(run: Run, ids: RunIds) -> dict[str, Any]:
    """What an artifact of this run says about its origin: run name, model, pruner, sparsity, adapter and rank, and
    the identity of the pruned base (the pruning cache key's digest and the key itself)."""
    job = run.job
    return {"run": ids["name"], "model": job.model.name, "pruner": job.pruner.name, "sparsity": job.sparsity.name,
            "adapter": job.adapter.name, "r": getattr(job.adapter, "r", None), **identity_record(run),
            "pruning_key": run.identity.key}


def log_run_outputs(run: Run, loggers: Sequence[Logger], ids: RunIds, adapter_dir: str | None,
                    merged_dir: str | None) -> list[str]:
    """Rank 0, after finalize: the adapter folder (type ``adapter``) and, with ``logger.wandb.log_model=true``, the
    merged model (type ``model``) as W&B artifacts named ``<kind>-<run name>``; returns the artifact names (none
    without a W&B logger)."""
    wandb_cfg = run.job.logger.wandb
    if wandb_cfg is None or not wandb_loggers(loggers):
        return []
    meta = artifact_metadata(run, ids)
    names: list[str] = []
    if adapter_dir and Path(adapter_dir).is_dir():
        names += log_folder_artifact(loggers, adapter_dir, f"adapter-{ids['name']}", "adapter", meta)
    if wandb_cfg.log_model and merged_dir and Path(merged_dir).is_dir():
        names += log_folder_artifact(loggers, merged_dir, f"merged-{ids['name']}", "model", meta)
    return names


def log_final_table(loggers: Sequence[Logger], summary: Mapping[str, Any]) -> None:
    """The job's perplexities with their intervals as the W&B table ``final/perplexity``, one row per stage (the same
    numbers are the ``final/ppl_<stage>``, ``..._ci_low``, ``..._ci_high`` summary keys)."""
    log_perplexity_table(loggers, "final/perplexity", "stage", summary.get("perplexity") or {})
