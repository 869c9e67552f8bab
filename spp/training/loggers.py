"""Build the Lightning loggers of the ``logger`` group: CSV always, W&B (offline without a key), TensorBoard."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger, WandbLogger

WANDB_MODES = ("auto", "online", "offline", "disabled")


def wandb_has_api_key() -> bool:
    """Whether W&B credentials exist (``WANDB_API_KEY`` or an ``api.wandb.ai`` entry in ``~/.netrc``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def run_tags(cfg: Any) -> dict[str, Any]:
    """Name, group and tags of a run from model / pruner / sparsity / adapter / r.

    A chosen W&B logger's ``logger.wandb.name`` / ``group`` / ``tags`` override or extend these, so
    ``summary.json`` names the run exactly as the dashboard does.
    """
    base = f"{cfg.model.name}-{cfg.pruner.name}-{cfg.sparsity.name}"
    adapter = cfg.adapter.name if cfg.adapter.name == "none" else f"{cfg.adapter.name}-r{cfg.adapter.r}"
    tags = [cfg.model.name, cfg.pruner.name, cfg.sparsity.name, cfg.adapter.name, f"r{cfg.adapter.r}"]
    ids = {"name": f"{base}-{adapter}", "group": base, "tags": tags}
    wb = cfg.logger.get("wandb") if "logger" in cfg else None
    if wb is not None:
        ids["name"] = wb.get("name") or ids["name"]
        ids["group"] = wb.get("group") or ids["group"]
        ids["tags"] = list(dict.fromkeys([*tags, *(wb.get("tags") or [])]))
    return ids


def final_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The job's end results as flat ``final/...`` scalars for the loggers (W&B charts and run summary, CSV).

    Perplexities (dense, pruned, merged); ``acc`` / ``acc_norm`` per lm-eval task (MMLU included) and the 7-task
    mean, named as ``eval.py`` logs them (:func:`spp.eval.tables.task_metrics`); sparsity before / after the
    merge; trainable parameters; and for LoRA* the share of the update re-masking removed.
    """
    out: dict[str, float] = {}
    for stage, entry in (summary.get("perplexity") or {}).items():
        if entry:
            out[f"final/ppl_{stage}"] = float(entry["ppl"])
    from spp.eval.tables import task_metrics

    zero_shot = (summary.get("zero_shot") or {}).get("metrics") or {}
    out.update({f"final/{key}": value for key, value in task_metrics(zero_shot).items()})
    sparsity = summary.get("sparsity") or {}
    for key in ("before", "after"):
        if sparsity.get(key) is not None:
            out[f"final/sparsity_{key}"] = float(sparsity[key])
    if (summary.get("params") or {}).get("trainable") is not None:
        out["final/trainable_params"] = float(summary["params"]["trainable"])
    if (summary.get("merge") or {}).get("removed_fraction") is not None:
        out["final/remask_removed_fraction"] = float(summary["merge"]["removed_fraction"])
    return out


def log_final_metrics(loggers: list[Logger], summary: dict[str, Any], step: int) -> dict[str, float]:
    """Log :func:`final_metrics` to every logger at ``step`` and flush them; returns what was logged.

    For ``adapter=none`` (no training loop) this is what creates the W&B run, so the pruned-only rows of a
    sweep appear on the dashboard beside the trained ones.
    """
    metrics = final_metrics(summary)
    for logger in loggers:
        if metrics:
            logger.log_metrics(metrics, step=step)
        if isinstance(logger, WandbLogger):
            logger.experiment.summary.update(metrics)
        logger.save()
    return metrics


def build_loggers(cfg: Any, run_dir: str | Path) -> list[Logger]:
    """Instantiate the chosen loggers, all writing under ``run_dir``.

    Args:
        cfg: The whole job config (``logger`` group plus the names used for W&B name/group/tags).
        run_dir: The job's output directory.

    Raises:
        ValueError: an unknown ``logger.wandb.mode``.
    """
    run_dir = Path(run_dir)
    chosen = cfg.logger
    loggers: list[Logger] = []
    csv_cfg = chosen.csv
    loggers.append(
        CSVLogger(
            save_dir=str(run_dir),
            name=csv_cfg.name if csv_cfg else "csv",
            version="",
            flush_logs_every_n_steps=csv_cfg.flush_logs_every_n_steps if csv_cfg else 50,
        )
    )
    if chosen.tensorboard is not None:
        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name=chosen.tensorboard.name, version=""))
    if chosen.wandb is not None:
        wb = chosen.wandb
        if wb.mode not in WANDB_MODES:
            raise ValueError(f"logger.wandb.mode={wb.mode!r}: use one of {WANDB_MODES}")
        mode = wb.mode
        if mode == "auto":
            mode = os.environ.get("WANDB_MODE") or ("online" if wandb_has_api_key() else "offline")
        ids = run_tags(cfg)
        loggers.append(
            WandbLogger(
                project=wb.project,
                entity=wb.entity,
                name=ids["name"],
                group=ids["group"],
                tags=ids["tags"],
                save_dir=str(run_dir),
                mode=mode,
                log_model=wb.log_model,
            )
        )
    return loggers


def finish_wandb() -> None:
    """Close the current W&B run, if any (one run per job in a multirun)."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
