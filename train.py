"""Train SPP on a pruned model: ``python train.py model=llama13b pruner=sparsegpt sparsity=unstructured50``.

The whole job (``spp/training/phases.py``), on every rank that the launcher (Lightning's own, ``torchrun`` or
``srun``) started:

1. ``fit`` builds a Lightning ``Trainer`` whose first callback is the ``PruningCallback``
   (``spp/training/callbacks/pruning.py``). In its ``setup`` hook — the process group exists, nothing is sharded
   yet — every rank takes part in pruning: global rank 0 loads the weights into host memory, the other ranks
   build the ``meta`` skeleton; the calibration batches and perplexity windows are split over the ranks and one
   decoder block at a time visits each rank's device; the dense and pruned perplexities and the pruned weights
   come from the on-disk caches when they are there;
2. ``SPPModule.configure_model`` attaches the adapter (``adapter=spp|lora|...``) and gives every rank its part of
   the model from rank 0 (FSDP2 shards, or a DDP replica); Lightning trains it (DDP, FSDP2 or DeepSpeed;
   ``adapter=none`` prunes without a Trainer), then the trainable tensors are gathered once;
3. ``finalize`` (``spp/training/finalize.py``), on every rank: rank 0 writes the adapter files; the merged model is
   exported block by block (block ``i`` merged, audited and written by rank ``i mod N``); every rank then takes
   part in evaluating the export (perplexity windows and lm-eval documents split over the ranks, the same
   ``evaluate`` as ``eval.py``); the guards move a diverged run's export to ``merged.diverged``. The process group
   closes after it.

``python train.py -m adapter.r=4,8,16`` sweeps with one pruning; ``plan=true`` prints the memory and time plan
of the job (``docs/plan.md``) and exits without reading a weight. Composes ``conf/train.yaml``, converted once
into :class:`spp.training.config.TrainJobConfig` (every value checked there).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not os.isatty(2):  # stderr is a file or a pipe: no redrawn tqdm bars in it (tqdm reads TQDM_* at import)
    os.environ.setdefault("TQDM_DISABLE", "1")

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from spp.atomic import remove_stale_temporaries, write_json_atomic  # noqa: E402
from spp.cli_help import register_help  # noqa: E402
from spp.distributed import DistContext, close_process_group  # noqa: E402
from spp.errors import DivergedError, cli_errors  # noqa: E402
from spp.eval.tables import final_metrics  # noqa: E402
from spp.loggers import build_loggers, finish_wandb, log_final_metrics, run_tags, save_and_print_config  # noqa: E402
from spp.overrides import checked_overrides  # noqa: E402
from spp.paths import data_provenance, forget_data_reads  # noqa: E402
from spp.planning.job import plan_output  # noqa: E402
from spp.preflight.jobs import preflight_train  # noqa: E402
from spp.preflight.model_files import model_arch  # noqa: E402
from spp.run_lock import hold_run_dir, is_job_leader  # noqa: E402
from spp.sweeps import require_objective_recorded, require_validation_objective  # noqa: E402
from spp.training.callbacks.adapter_checkpoint import resolve_resume  # noqa: E402
from spp.training.config import TrainJobConfig, load_job, register_configs  # noqa: E402
from spp.training.finalize import finalize  # noqa: E402
from spp.training.phases import fit, job_device  # noqa: E402
from spp.training.report import build_summary, print_results, sweep_objective  # noqa: E402
from spp.training.val_schedule import no_validation_reason  # noqa: E402

register_configs()
register_help()


def run_dir_of(job: TrainJobConfig) -> Path:
    """``run_dir`` from the config, else Hydra's job output directory, else ``outputs/train``."""
    if job.run_dir:
        return Path(job.run_dir).expanduser().resolve()
    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path("outputs/train").resolve()


def run_job(job: TrainJobConfig, callbacks: list[Callback] | None = None) -> dict | None:
    """Run ``fit`` (pruning in the Trainer's setup callback, then training) → ``finalize`` and report; returns the
    summary on global rank 0 (``None`` elsewhere).

    After the preflight, the job's leader holds ``<run_dir>/.spp-run.lock`` until its last file is written: a
    second job on the same ``run_dir`` is refused in one line (``spp.run_lock``), before any clean-up or load.
    """
    start = time.perf_counter()
    run_dir = run_dir_of(job)
    forget_data_reads()
    preflight_train(job, resolve_resume(job.trainer.resume_from, run_dir / "checkpoints"))
    with hold_run_dir(run_dir, "run_dir"):
        return _run_locked(job, run_dir, callbacks, start)


def _run_locked(job: TrainJobConfig, run_dir: Path, callbacks: list[Callback] | None, start: float) -> dict | None:
    """The three phases and the report, inside the run directory's lock (:func:`run_job`)."""
    if is_job_leader():
        remove_stale_temporaries(run_dir, [Path(job.cache_dir).expanduser() / "pruning",
                                           Path(job.cache_dir).expanduser() / "ppl"])
        save_and_print_config(OmegaConf.structured(job), run_dir, show=job.print_config)
    wandb = job.logger.wandb
    rank = getattr(job.adapter, "r", None)  # the methods with a rank (spp, lora, ...) name it in the run
    ids = run_tags(job.model.name, job.pruner.name, job.sparsity.name, job.adapter.name, rank, wandb)
    loggers = build_loggers(job.logger, run_dir, ids)
    try:
        pruned, fitted = fit(job, run_dir, loggers, callbacks)
        final = finalize(job, pruned, fitted, run_dir, DistContext.current(job_device(job)))
        close_process_group()
        if not fitted.is_global_zero:
            return None
        timings = {**pruned.seconds, "train": fitted.seconds, **{f"finalize_{k}": v for k, v in final.seconds.items()},
                   "total": round(time.perf_counter() - start, 2)}
        summary = build_summary(job, run_dir, ids, pruned, fitted, final, timings)
        summary.update(status=final.status, diverged=final.diverged, data_files=data_provenance())
        log_final_metrics(loggers, final_metrics(summary), step=fitted.steps)
    finally:
        finish_wandb()
    write_json_atomic(run_dir / "summary.json", summary)
    print_results(summary)
    if final.export_error is not None:  # e.g. the disk is full: summary.json says "export_failed"
        raise final.export_error
    if final.diverged:
        raise DivergedError(f"the run diverged: {'; '.join(final.diverged)} (summary.json status: diverged; merged "
                            f"model not exported; adapter and checkpoints kept in {run_dir})",
                            "lower trainer.lr, or raise guards.max_ppl_ratio / set guards.enabled=false to accept it",
                            key="guards")
    return summary


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


@checked_overrides("train.py", TrainJobConfig)
@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Run one job; returns ``sweep_objective`` (by default the last validation loss) for Hydra sweepers."""
    with cli_errors("train.py"):
        job = load_job(cfg)
        if job.plan:
            return show_plan(job)
        require_validation_objective(str(job.sweep_objective))  # an Optuna sweep selects on validation data only
        require_objective_recorded(str(job.sweep_objective), lambda: no_validation_reason(job))  # ... and needs one
        summary = run_job(job)
        return sweep_objective(summary, job.sweep_objective) if summary else None


if __name__ == "__main__":
    main()
