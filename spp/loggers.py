"""What a job reports: the ``logger`` group (CSV always, W&B offline without a key, TensorBoard), run names and
tags, end-of-job metrics, and the resolved config.

Shared by ``train.py`` and ``eval.py``; it takes plain values (names, typed logger configs), never a whole job
config, so neither job has to look like the other. Each logger config carries its Lightning class as
``_target_`` and is built with :func:`hydra.utils.instantiate`; the run directory, the W&B name / group / tags
and the resolved W&B mode are passed on top.
"""

from __future__ import annotations

import netrc
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.tree import Tree

from spp.atomic import write_text_atomic

WANDB_MODES = ("auto", "online", "offline", "disabled")


@dataclass
class CSVLoggerConfig:
    """Lightning ``CSVLogger`` under ``<run_dir>/<name>``."""

    _target_: str = "lightning.pytorch.loggers.CSVLogger"
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

    _target_: str = "lightning.pytorch.loggers.WandbLogger"
    project: str = "spp"
    entity: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    mode: str = "auto"
    log_model: bool = False

    def __post_init__(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ValueError(f"logger.wandb.mode={self.mode!r}: use one of {WANDB_MODES}")


@dataclass
class TensorBoardLoggerConfig:
    """Lightning ``TensorBoardLogger`` under ``<run_dir>/<name>`` (needs ``tensorboard`` or ``tensorboardX``)."""

    _target_: str = "lightning.pytorch.loggers.TensorBoardLogger"
    name: str = "tensorboard"


@dataclass
class LoggersConfig:
    """Which loggers run (``logger=csv``, ``logger=wandb`` or ``logger=[csv,wandb,tensorboard]``).

    A CSV logger is always added (its ``metrics.csv`` feeds the summary) even when ``csv`` is not chosen.
    """

    csv: CSVLoggerConfig | None = None
    wandb: WandbLoggerConfig | None = None
    tensorboard: TensorBoardLoggerConfig | None = None


class RunIds(TypedDict):
    """A run's W&B name, group and tags (also written to ``summary.json``)."""

    name: str
    group: str
    tags: list[str]


def wandb_has_api_key() -> bool:
    """Whether W&B credentials exist (``WANDB_API_KEY`` or an ``api.wandb.ai`` entry in ``~/.netrc``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode(mode: str) -> str:
    """``auto`` → ``$WANDB_MODE``, else ``online`` with an API key and ``offline`` without; others unchanged."""
    if mode != "auto":
        return mode
    return os.environ.get("WANDB_MODE") or ("online" if wandb_has_api_key() else "offline")


def run_tags(
    model: str,
    pruner: str,
    sparsity: str,
    adapter: str,
    r: int | None = None,
    wandb_cfg: WandbLoggerConfig | None = None,
    objective: str = "ce",
) -> RunIds:
    """Name, group and tags of a run from plain names.

    ``name = <model>-<pruner>-<sparsity>-<adapter>[-r<r>]`` (no rank for ``adapter="none"`` or ``r=None``),
    ``group = <model>-<pruner>-<sparsity>``, ``tags = [model, pruner, sparsity, adapter, r<r>]`` (``r<r>`` only
    when ``r`` is given). A training objective other than the paper's ``ce`` is appended to the name and the tags
    (``...-spp-r16-distill``). A chosen W&B logger's ``name`` / ``group`` replace these and its ``tags`` extend them,
    so ``summary.json`` names the run exactly as the dashboard does.
    """
    base = f"{model}-{pruner}-{sparsity}"
    label = adapter if adapter == "none" or r is None else f"{adapter}-r{r}"
    label += "" if objective == "ce" else f"-{objective}"
    tags = [model, pruner, sparsity, adapter, *([f"r{r}"] if r is not None else []),
            *([objective] if objective != "ce" else [])]
    ids = RunIds(name=f"{base}-{label}", group=base, tags=tags)
    if wandb_cfg is not None:
        ids["name"] = wandb_cfg.name or ids["name"]
        ids["group"] = wandb_cfg.group or ids["group"]
        ids["tags"] = list(dict.fromkeys([*tags, *(wandb_cfg.tags or [])]))
    return ids


def build_loggers(loggers_cfg: LoggersConfig, run_dir: str | Path, ids: RunIds) -> list[Logger]:
    """Instantiate the chosen loggers (CSV always, then TensorBoard, then W&B), all writing under ``run_dir``.

    Args:
        loggers_cfg: The ``logger`` group, typed.
        run_dir: The job's output directory (``save_dir`` of every logger; fixed ``version=""``).
        ids: W&B name / group / tags, from :func:`run_tags`.
    """
    save_dir = str(Path(run_dir))
    loggers: list[Logger] = [instantiate(loggers_cfg.csv or CSVLoggerConfig(), save_dir=save_dir, version="")]
    if loggers_cfg.tensorboard is not None:
        loggers.append(instantiate(loggers_cfg.tensorboard, save_dir=save_dir, version=""))
    if loggers_cfg.wandb is not None:
        wb = loggers_cfg.wandb
        loggers.append(instantiate(wb, save_dir=save_dir, mode=wandb_mode(wb.mode), name=ids["name"],
                                   group=ids["group"], tags=ids["tags"], _convert_="all"))
    return loggers


def log_final_metrics(loggers: list[Logger], metrics: Mapping[str, float], step: int) -> None:
    """Log a job's end results (``final/...`` scalars) to every logger at ``step``, then flush each logger.

    On W&B the metrics also go to the run summary (the runs table). For ``adapter=none`` (no training loop)
    this is what creates the W&B run, so pruned-only rows of a sweep appear beside the trained ones.
    """
    for logger in loggers:
        if metrics:
            logger.log_metrics(dict(metrics), step=step)
        if isinstance(logger, WandbLogger):
            logger.experiment.summary.update(dict(metrics))
        logger.save()


def finish_wandb() -> None:
    """Close the current W&B run, if any (one run per job in a multirun); a no-op when wandb was never imported."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


def config_tree(cfg: DictConfig) -> Tree:
    """The resolved config as a Rich tree (one branch per group)."""
    tree = Tree("[bold]config[/bold]")
    for key, value in cfg.items():
        branch = tree.add(f"[bold cyan]{key}[/bold cyan]")
        if isinstance(value, DictConfig):
            branch.add(OmegaConf.to_yaml(value, resolve=True).rstrip() or "{}")
        else:
            branch.add(str(value))
    return tree


def save_and_print_config(cfg: DictConfig, run_dir: str | Path, show: bool = True) -> Path:
    """Save the resolved config as ``<run_dir>/resolved_config.yaml`` and print it as a Rich tree; return the path."""
    path = write_text_atomic(Path(run_dir) / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    if show:
        Console().print(config_tree(cfg))
    return path
