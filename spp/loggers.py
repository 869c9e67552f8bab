"""What a job reports: the ``logger`` group (CSV always, W&B offline without a key, TensorBoard), run names and
tags, end-of-job metrics and tables, the resolved config (W&B's ``run.config``) and folders as W&B artifacts."""

from __future__ import annotations

import csv
import io
import json
import netrc
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.tree import Tree

from spp.atomic import write_json_atomic, write_text_atomic

WANDB_MODES = ("auto", "online", "offline", "disabled")
WANDB_RUN_FILE = "wandb_run.json"
"""``<run_dir>/wandb_run.json``: the id of the job's W&B run, written when the run starts (a resume continues it)."""


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
        log_model: Also upload the merged model (``<run_dir>/merged``) as a W&B artifact of type ``model``
            (the adapter folder always is, as type ``adapter``). Lightning's own checkpoint upload is not used:
            the checkpoints stay in ``<run_dir>/checkpoints``.
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
    """Name ``<model>-<pruner>-<sparsity>-<adapter>[-r<r>][-<objective>]``, group ``<model>-<pruner>-<sparsity>``
    and tags; a chosen W&B logger's ``name`` / ``group`` replace them and its ``tags`` extend them."""
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


def config_record(job: Any, **extra: Mapping[str, Any]) -> dict[str, Any]:
    """A typed job config as plain nested values (enums as names) plus ``extra`` groups: W&B's ``run.config``.

    Kept nested: W&B forbids periods in keys, and its runs table shows each leaf as a dotted column."""
    tree = OmegaConf.to_container(OmegaConf.structured(job), resolve=True, enum_to_str=True)
    return {**tree, **{key: dict(value) for key, value in extra.items()}}


def recorded_wandb_run(checkpoint: str | Path | None) -> str | None:
    """The W&B run id the job that wrote ``checkpoint`` recorded in its run folder (``<run_dir>/checkpoints/<ckpt>``
    → ``<run_dir>/wandb_run.json``); ``None`` without a checkpoint or a record (a run from before the record)."""
    if checkpoint is None:
        return None
    path = Path(checkpoint).parent.parent / WANDB_RUN_FILE
    try:
        run_id = json.loads(path.read_text(encoding="utf-8")).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) and run_id else None


def _record_wandb_run(logger: WandbLogger, run_dir: Path) -> None:
    """Rank 0: write the started W&B run's id to ``<run_dir>/wandb_run.json`` (atomically), for a later resume."""
    if rank_zero_only.rank == 0 and logger.version:
        write_json_atomic(run_dir / WANDB_RUN_FILE, {"id": logger.version, "project": logger.name})


def build_loggers(loggers_cfg: LoggersConfig, run_dir: str | Path, ids: RunIds,
                  config: Mapping[str, Any] | None = None, resume: str | Path | None = None) -> list[Logger]:
    """Instantiate the chosen loggers (CSV always, then TensorBoard, then W&B), all writing under ``run_dir``.

    ``config`` (:func:`config_record`) is logged as soon as W&B's logger exists, so the run holds it from the start.
    ``resume`` (the checkpoint a training job resumes) continues the W&B run its job recorded (same run id, W&B's
    ``resume="allow"``) instead of starting a second run of the same name."""
    save_dir = str(Path(run_dir))
    loggers: list[Logger] = [instantiate(loggers_cfg.csv or CSVLoggerConfig(), save_dir=save_dir, version="")]
    if loggers_cfg.tensorboard is not None:
        loggers.append(instantiate(loggers_cfg.tensorboard, save_dir=save_dir, version=""))
    if loggers_cfg.wandb is not None:
        wb = loggers_cfg.wandb
        run_id = recorded_wandb_run(resume)
        continued = {"id": run_id, "resume": "allow"} if run_id else {}
        wandb_logger = instantiate(wb, save_dir=save_dir, mode=wandb_mode(wb.mode), name=ids["name"],
                                   group=ids["group"], tags=ids["tags"], log_model=False, _convert_="all",
                                   **continued)
        if config:
            wandb_logger.log_hyperparams(dict(config))  # W&B's run.config (starts the run: rank 0 only)
            _record_wandb_run(wandb_logger, Path(run_dir))
        loggers.append(wandb_logger)
    return loggers


def continue_csv_metrics(loggers: Sequence[Logger]) -> None:
    """Rank 0, on a resume: keep the rows of the interrupted run's ``metrics.csv`` (Lightning's CSV writer deletes
    the file when it starts) and append the resumed run's rows to them."""
    for logger in loggers:
        if not isinstance(logger, CSVLogger) or rank_zero_only.rank != 0:
            continue
        path = Path(logger.log_dir) / "metrics.csv"
        rows = path.read_text(encoding="utf-8") if path.is_file() else ""
        writer = logger.experiment
        if rows:
            write_text_atomic(path, rows)
            header = next(csv.reader(io.StringIO(rows)), [])
            writer.metrics_keys = sorted({*writer.metrics_keys, *header})


def wandb_loggers(loggers: Sequence[Logger]) -> list[WandbLogger]:
    """The W&B loggers among ``loggers``."""
    return [logger for logger in loggers if isinstance(logger, WandbLogger)]


def artifact_name(name: str) -> str:
    """``name`` with every character W&B refuses in an artifact name (other than letters, digits, ``-_.``) as ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "artifact"


def log_folder_artifact(loggers: Sequence[Logger], folder: str | Path, name: str, kind: str,
                        metadata: Mapping[str, Any]) -> list[str]:
    """Log ``folder`` as a W&B artifact of type ``kind`` to each W&B run; returns the artifact names.

    Files are referenced in place (``policy="immutable"``), so keep the run folder until an offline run is synced."""
    import wandb  # the W&B loggers exist, so wandb is installed; a job without W&B never imports it

    names = []
    for logger in wandb_loggers(loggers):
        artifact = wandb.Artifact(artifact_name(name), type=kind, metadata=dict(metadata))
        artifact.add_dir(str(folder), policy="immutable")
        logger.experiment.log_artifact(artifact)
        names.append(artifact.name)
    return names


def log_table(loggers: Sequence[Logger], key: str, columns: list[str], rows: list[list[Any]]) -> None:
    """Log a ``wandb.Table`` under ``key`` to each W&B logger (the other loggers have no tables)."""
    for logger in wandb_loggers(loggers):
        logger.log_table(key=key, columns=columns, data=rows)


PPL_COLUMNS = ("ppl", "ci_low", "ci_high", "windows")
"""The columns of a perplexity table after its first (the stage or the source)."""


def log_perplexity_table(loggers: Sequence[Logger], key: str, label: str,
                         entries: Mapping[str, Mapping[str, Any] | None]) -> None:
    """The W&B table ``key``: one row per measured perplexity (``entries``: name → record with ``ppl``, its 95 %
    interval ``ci_low`` / ``ci_high`` and ``windows``; ``None`` entries skipped), first column ``label``."""
    rows = [[name, *(entry.get(column) for column in PPL_COLUMNS)] for name, entry in entries.items() if entry]
    if rows:
        log_table(loggers, key, [label, *PPL_COLUMNS], rows)


def log_final_metrics(loggers: list[Logger], metrics: Mapping[str, float], step: int) -> None:
    """Log end-of-job scalars to every logger at ``step`` (and W&B's run summary), then flush each logger.

    For ``adapter=none`` this creates the W&B run, so pruned-only sweep rows appear beside trained ones."""
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
        text = OmegaConf.to_yaml(value, resolve=True).rstrip() or "{}" if isinstance(value, DictConfig) else str(value)
        tree.add(f"[bold cyan]{key}[/bold cyan]").add(text)
    return tree


def save_and_print_config(cfg: DictConfig, run_dir: str | Path, show: bool = True) -> Path:
    """Save the resolved config as ``<run_dir>/resolved_config.yaml`` and print it as a Rich tree; return the path."""
    path = write_text_atomic(Path(run_dir) / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    if show:
        Console().print(config_tree(cfg))
    return path
