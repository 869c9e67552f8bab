"""Optuna sweeps on validation numbers (``hydra/sweeper=optuna_lr``): the objective check and a callback writing
each trial to ``<sweep dir>/trials.json`` (the sweeper keeps its study in memory and writes only the best point)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from spp.atomic import write_json_atomic
from spp.errors import UserError
from spp.eval.perplexity import WIKITEXT2_VAL

OBJECTIVE_FILE = "objective.json"
TRIALS_FILE = "trials.json"
VALIDATION_OBJECTIVES: tuple[str, ...] = ("val_loss", "ppl_val_merged")
"""Objectives a hyper-parameter search may optimise: ``val_loss`` = the Alpaca held-out loss (last ``val/loss``);
``ppl_val_merged`` = the merged model's WikiText-2 *validation* perplexity (``eval.ppl_source`` or
``eval.extra_ppl_sources`` holding ``wikitext2_val``; measured after the merge, so LoRA* is judged re-masked)."""


def objective_value(summary: dict[str, Any], objective: str) -> float | None:
    """The value ``objective`` names in a run's ``summary.json`` (``val_loss``, ``ppl_val_merged``, or ``ppl_merged``
    on the test split, for reporting only); ``None`` when the run did not measure it."""
    if objective == "val_loss":
        val = (summary.get("losses") or {}).get("val") or []
        return float(val[-1]) if val else None
    if objective == "ppl_val_merged":
        entry = (summary.get("merged_ppl_by_source") or {}).get(WIKITEXT2_VAL)
        return float(entry["ppl"]) if entry else None
    if objective == "ppl_merged":
        merged = (summary.get("perplexity") or {}).get("merged")
        return float(merged["ppl"]) if merged else None
    return None


def optuna_sweep() -> bool:
    """Whether this job is a trial of a Hydra multirun under an Optuna sweeper (whose value it must return)."""
    if not HydraConfig.initialized():
        return False
    hydra_cfg = HydraConfig.get()
    return hydra_cfg.mode == RunMode.MULTIRUN and "optuna" in str(hydra_cfg.sweeper.get("_target_", "")).lower()


def require_validation_objective(objective: str | None) -> None:
    """Refuse an Optuna sweep job whose ``sweep_objective`` is not a validation metric: choosing on the test split
    would leak it into the numbers reported on it. Does nothing outside an Optuna multirun."""
    if optuna_sweep() and objective not in VALIDATION_OBJECTIVES:
        raise UserError(
            f"sweep_objective={objective}: an Optuna sweep selects hyper-parameters, so the job must return a "
            f"validation metric ({', '.join(VALIDATION_OBJECTIVES)}), never a test-split number",
            "set sweep_objective=val_loss or ppl_val_merged (hydra/sweeper=optuna_lr sets val_loss; drop "
            "sweep_objective= from the command line)",
            key="sweep_objective",
        )


def require_objective_recorded(objective: str | None, missing: Callable[[], str | None]) -> None:
    """Refuse, before the first trial, an Optuna sweep whose jobs cannot record ``val_loss`` (Optuna would fail only
    after every trial trained); ``missing`` returns ``"<what> — <fix>"`` or ``None``."""
    if not optuna_sweep() or objective != "val_loss":
        return
    reason = missing()
    if reason:
        what, _, fix = reason.partition(" — ")
        raise UserError(f"sweep_objective=val_loss: this Optuna sweep's jobs would record no validation loss: {what}",
                        fix or "make validation run (trainer.val_check_interval, data.val_size)",
                        key="sweep_objective")


def _task_rank() -> int:
    """The process's rank among the tasks of a Slurm / submitit-local job (0 outside one)."""
    return int(os.environ.get("SLURM_PROCID") or os.environ.get("SUBMITIT_LOCAL_GLOBALID") or 0)


def _objective_value(job_return: JobReturn) -> float | None:
    if job_return.status != JobStatus.COMPLETED:
        return None
    try:
        value = float(job_return.return_value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class SweepTrialsCallback(Callback):
    """Record each job's objective (``<run>/objective.json``) and gather them in ``<sweep>/trials.json``."""

    def __init__(self, direction: str = "minimize") -> None:
        if direction not in ("minimize", "maximize"):
            raise ValueError(f"direction={direction!r} must be minimize or maximize")
        self.direction = direction

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Write ``objective.json`` in the job's output directory (in the job's process; with several tasks per
        Slurm job, as with one process per GPU, only task 0 writes: its value is the one the launcher returns)."""
        if _task_rank() != 0:
            return
        hydra_cfg = config.hydra
        record = {
            "job": int(hydra_cfg.job.num),
            "overrides": list(hydra_cfg.overrides.task),
            "sweep_objective": config.get("sweep_objective"),
            "value": _objective_value(job_return),
            "status": job_return.status.name,
            "run_dir": str(hydra_cfg.runtime.output_dir),
        }
        write_json_atomic(Path(hydra_cfg.runtime.output_dir) / OBJECTIVE_FILE, record)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Gather the jobs' ``objective.json`` files into ``<sweep dir>/trials.json``, best marked."""
        sweep_dir = Path(str(config.hydra.sweep.dir))
        trials = sorted((json.loads(p.read_text()) for p in sweep_dir.rglob(OBJECTIVE_FILE)),
                        key=lambda t: t["job"])
        done = [t for t in trials if t["value"] is not None]
        pick = min if self.direction == "minimize" else max
        best = pick(done, key=lambda t: t["value"]) if done else None
        write_json_atomic(sweep_dir / TRIALS_FILE, {"direction": self.direction, "trials": trials,
                                                    "best_job": best["job"] if best else None})

