"""``eval.py``: evaluate a saved model, or a model pruned through the cache (optionally with an adapter on top)."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import seed_everything
from omegaconf import OmegaConf

from spp.atomic import remove_stale_temporaries
from spp.commands.entry import Command, hydra_output_dir
from spp.errors import user_errors
from spp.eval.harness import zero_shot_mean
from spp.eval.job_config import EvalJobConfig, register_eval_schema
from spp.eval.run_name import register_eval_resolvers
from spp.eval.runner import preflight, run_eval_job
from spp.eval.tables import markdown_report
from spp.loggers import save_and_print_config
from spp.quiet import quiet_lightning
from spp.run_lock import hold_run_dir


def run(job: EvalJobConfig) -> float | None:
    """Run one evaluation; returns the 7-task mean accuracy, else the perplexity (the sweep objective)."""
    with user_errors(ValueError, FileNotFoundError):
        preflight(job)
    out_dir = Path(job.run_dir or hydra_output_dir()).expanduser()
    with hold_run_dir(out_dir, "run_dir"):  # one job per output folder (spp.run_lock)
        remove_stale_temporaries(out_dir, [Path(job.cache_dir).expanduser() / "pruning"])
        save_and_print_config(OmegaConf.structured(job), out_dir, show=job.print_config)
        quiet_lightning()
        seed_everything(job.seed, workers=True)
        record = run_eval_job(job, out_dir)
    if record is None:  # not global rank 0: rank 0 writes and prints
        return None
    print(markdown_report([record], title=f"Evaluation: {record.label}"))
    print(f"results: {out_dir / 'results.json'}  {out_dir / 'results.md'}")
    mean = zero_shot_mean(record.tasks)
    if mean is not None:
        return mean
    return record.ppl[job.eval.ppl_source]["ppl"] if record.ppl else None


def register_eval() -> None:
    """Store the schemas and the run-name resolvers ``conf/evaluate.yaml`` uses."""
    register_eval_schema()
    register_eval_resolvers()


COMMAND = Command("eval.py", "evaluate", EvalJobConfig, run, register_eval)
"""``python eval.py ...``: composes ``conf/evaluate.yaml`` into :class:`EvalJobConfig` and runs :func:`run`."""
