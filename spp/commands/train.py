"""``train.py``: prune → attach the adapter → train → merge, audit, export → evaluate, as one job.

The phases live in ``spp/training/phases.py`` and ``spp/training/finalize.py``; tests import :func:`run_job`."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import Callback
from omegaconf import OmegaConf

from spp.atomic import remove_stale_temporaries, write_json_atomic
from spp.commands.entry import Command
from spp.distributed import DistContext, close_process_group, local_device
from spp.errors import DivergedError
from spp.eval.doc_records import DOC_RECORDS_FILE, write_doc_records
from spp.eval.tables import final_metrics
from spp.loggers import build_loggers, finish_wandb, log_final_metrics, run_tags, save_and_print_config
from spp.paths import data_provenance, forget_data_reads
from spp.planning.job import plan_output
from spp.preflight.jobs import preflight_train
from spp.preflight.model_files import model_arch
from spp.run_lock import hold_run_dir, is_job_leader
from spp.sweeps import objective_value, require_objective_recorded, require_validation_objective
from spp.training.callbacks.adapter_checkpoint import resolve_resume
from spp.training.config import TrainJobConfig, register_train_schema
from spp.training.finalize import FinalizeResult, finalize
from spp.training.phases import fit
from spp.training.report import build_summary, print_results
from spp.training.run import Methods, Run, build_run, resolve_methods
from spp.training.run_logging import log_final_table, log_run_outputs, logged_config
from spp.training.val_schedule import no_validation_reason


def run(job: TrainJobConfig) -> float | None:
    """Run one job; returns ``sweep_objective`` (by default the last validation loss) for Hydra sweepers."""
    if job.plan:
        return show_plan(job)
    require_validation_objective(str(job.sweep_objective))  # an Optuna sweep selects on validation data only
    methods = resolve_methods(job)
    require_objective_recorded(str(job.sweep_objective),  # ... and needs one
                               lambda: no_validation_reason(job, methods.adapter))
    summary = run_job(job, methods=methods)
    return objective_value(summary, job.sweep_objective.value) if summary else None


def run_dir_of(job: TrainJobConfig) -> Path:
    """``run_dir`` from the config, else Hydra's job output directory, else ``outputs/train``."""
    if job.run_dir:
        return Path(job.run_dir).expanduser().resolve()
    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path("outputs/train").resolve()


def run_job(job: TrainJobConfig, callbacks: list[Callback] | None = None,
            methods: Methods | None = None) -> dict | None:
    """Run ``fit`` → ``finalize`` and report; the summary on global rank 0 (``None`` elsewhere).

    The leader holds ``<run_dir>/.spp-run.lock`` until its last file is written (a second job is refused)."""
    start = time.perf_counter()
    run_dir = run_dir_of(job)
    forget_data_reads()
    methods = methods if methods is not None else resolve_methods(job)
    preflight_train(job, resolve_resume(job.trainer.resume_from, run_dir / "checkpoints"), methods)
    with hold_run_dir(run_dir, "run_dir"):
        return _run_locked(build_run(job, run_dir, methods), callbacks, start)


def _run_locked(run: Run, callbacks: list[Callback] | None, start: float) -> dict | None:
    """The three phases and the report, inside the run directory's lock (:func:`run_job`)."""
    job, run_dir = run.job, run.run_dir
    if is_job_leader():
        remove_stale_temporaries(run_dir, [Path(job.cache_dir).expanduser() / cache for cache in ("pruning", "ppl")])
        save_and_print_config(OmegaConf.structured(job), run_dir, show=job.print_config)
    rank = getattr(job.adapter, "r", None)  # the methods with a rank (spp, lora, ...) name it in the run
    ids = run_tags(job.model.name, job.pruner.name, job.sparsity.name, job.adapter.name, rank, job.logger.wandb,
                   objective=job.objective.name)
    loggers = build_loggers(job.logger, run_dir, ids, logged_config(run),
                            resume=resolve_resume(job.trainer.resume_from, run_dir / "checkpoints"))
    try:
        pruned, fitted = fit(run, loggers, callbacks)
        final = finalize(run, pruned, fitted, DistContext.current(local_device(job.trainer.accelerator)))
        close_process_group()
        if not fitted.is_global_zero:
            return None
        timings = {**pruned.record.seconds, "train": fitted.record.seconds,
                   **{f"finalize_{k}": v for k, v in final.seconds.items()},
                   "total": round(time.perf_counter() - start, 2)}
        summary = build_summary(run, ids, pruned, fitted, final, timings)
        summary.update(status=final.status, diverged=final.diverged, data_files=data_provenance())
        log_final_metrics(loggers, final_metrics(summary), step=fitted.record.steps)
        log_final_table(loggers, summary)
        summary["run"]["artifacts"] = log_run_outputs(run, loggers, ids, final.adapter_dir, final.merged_dir)
    finally:
        finish_wandb()
    if final.evaluation is not None and final.evaluation.doc_records is not None:
        write_doc_records(run_dir / DOC_RECORDS_FILE, final.evaluation.doc_records)
    write_json_atomic(run_dir / "summary.json", summary)
    print_results(summary)
    _raise_failure(final, run_dir)
    return summary


def _raise_failure(final: FinalizeResult, run_dir: Path) -> None:
    """Raise a failed export's error (e.g. the disk is full: summary.json says ``export_failed``), or
    :class:`DivergedError` for a run the guards refused (summary.json says ``diverged``)."""
    if final.export_error is not None:
        raise final.export_error
    if final.diverged:
        raise DivergedError(f"the run diverged: {'; '.join(final.diverged)} (summary.json status: diverged; merged "
                            f"model not exported; adapter and checkpoints kept in {run_dir})",
                            "lower trainer.lr, or raise guards.max_ppl_ratio / set guards.enabled=false to accept it",
                            key="guards")


def show_plan(job: TrainJobConfig) -> None:
    """``plan=true``: print the memory and time plan (``docs/plan.md``) from the model's config alone, write it as
    JSON to ``plan_json`` when given (``-``: stdout, instead of the table); nothing else runs."""
    text, data = plan_output(job, model_arch(job.model))
    if job.plan_json == "-":
        print(json.dumps(data, indent=1))
        return
    print(text, end="")
    if job.plan_json:
        write_json_atomic(Path(job.plan_json).expanduser(), data)
        print(f"plan written: {job.plan_json}")


COMMAND = Command("train.py", "train", TrainJobConfig, run, register_train_schema)
"""``python train.py ...``: composes ``conf/train.yaml`` into :class:`TrainJobConfig` and runs :func:`run`."""
