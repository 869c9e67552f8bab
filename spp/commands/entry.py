"""The entry point the four commands share: each root script is ``main = hydra_entry(COMMAND)`` and calls it.

Environment defaults come first (before the libraries that read them import), then resolvers, schemas, plug-ins,
the override check, ``@hydra.main``, the typed job and ``run(job)`` inside :func:`spp.errors.cli_errors`."""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not os.isatty(2):  # stderr is a file or a pipe: no redrawn tqdm bars in it (tqdm reads TQDM_* at import)
    os.environ.setdefault("TQDM_DISABLE", "1")

import dataclasses  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from spp.cli_help import register_help  # noqa: E402
from spp.compare.naming import register_sweep_name  # noqa: E402
from spp.errors import cli_errors, to_job  # noqa: E402
from spp.overrides import checked_overrides  # noqa: E402
from spp.paths import CONF_DIR  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Command:
    """One command: what :func:`main` needs to run it."""

    script: str
    """The root script (``train.py``): every error line starts with it; its stem is Hydra's job name."""
    config_name: str
    """The primary config in ``conf/`` (``train``, ``prune``, ``evaluate``, ``generate``)."""
    schema: type
    """The typed job config (a dataclass) the composed config is converted into, checked against."""
    run: Callable[[Any], Any]
    """Runs one typed job; its return value goes back to Hydra (what a sweeper optimizes)."""
    register: Callable[[], None]
    """Stores the command's schemas (and resolvers) for Hydra; runs before the plug-ins load and Hydra composes."""


def run_dir_or(run_dir: str | None, default: str) -> str:
    """The ``spp_run_dir`` resolver of the commands' ``hydra.run.dir``: ``run_dir=`` when given (so the job's files,
    its ``<script>.log`` and ``.hydra/`` share one folder), else the command's own ``outputs/...`` name."""
    return str(Path(run_dir).expanduser()) if run_dir else default


def register_run_dir_resolver() -> None:
    """Register ``spp_run_dir`` (:func:`run_dir_or`) once, before Hydra composes a command's config."""
    if not OmegaConf.has_resolver("spp_run_dir"):
        OmegaConf.register_new_resolver("spp_run_dir", run_dir_or)


def hydra_output_dir() -> Path:
    """The output directory Hydra chose for this job (``hydra.run.dir``, or a sweep job's folder)."""
    return Path(HydraConfig.get().runtime.output_dir)


def hydra_entry(command: Command) -> Callable[..., Any]:
    """The command's ``@hydra.main`` function, wrapped by :func:`spp.overrides.checked_overrides`.

    ``conf/`` is absolute: Hydra resolves a relative ``config_path`` against this file, not the root script."""
    command.register()
    register_help()
    register_sweep_name()
    register_run_dir_resolver()

    def main(cfg: DictConfig) -> Any:
        with cli_errors(command.script):
            return command.run(to_job(cfg, command.schema))

    # Hydra names the job (hydra.job.name, the <name>.log file) after the task function's module: the script's.
    main.__module__ = Path(command.script).stem
    main.__doc__ = f"Hydra's task for {command.script}: convert the composed config once, then run the job."
    task = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=command.config_name)(main)
    return checked_overrides(command.script, command.schema, command.config_name)(task)

