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
    """Name, group and tags of a run from model / pruner / sparsity / adapter / r."""
    base = f"{cfg.model.name}-{cfg.pruner.name}-{cfg.sparsity.name}"
    adapter = cfg.adapter.name if cfg.adapter.name == "none" else f"{cfg.adapter.name}-r{cfg.adapter.r}"
    tags = [cfg.model.name, cfg.pruner.name, cfg.sparsity.name, cfg.adapter.name, f"r{cfg.adapter.r}"]
    return {"name": f"{base}-{adapter}", "group": base, "tags": tags}


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
        tags = list(dict.fromkeys([*ids["tags"], *wb.tags]))
        loggers.append(
            WandbLogger(
                project=wb.project,
                entity=wb.entity,
                name=wb.name or ids["name"],
                group=wb.group or ids["group"],
                tags=tags,
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
