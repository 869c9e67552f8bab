"""Evaluate a model: ``python eval.py model.path=<dir>`` or ``python eval.py pruner=wanda sparsity=nm2_4``.

Composes ``conf/evaluate.yaml`` (typed by :class:`spp.eval.job_config.EvalJobConfig`): WikiText-2 perplexity,
the paper's seven zero-shot tasks and 5-shot MMLU through lm-eval on the local data, on (a) a saved model
directory or (b) a model pruned through the pruning cache, optionally with an SPP adapter loaded on top.
Writes ``results.json`` and a Table-2-shaped ``results.md`` to the run directory and logs to the loggers.
Every bad input (unknown task, missing data file, model directory without weights, ``eval.seqlen`` longer than
the model's context) stops with one ``eval.py: error: ...`` line before the model is loaded.
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not os.isatty(2):  # stderr is a file or a pipe: no redrawn tqdm bars in it (tqdm reads TQDM_* at import)
    os.environ.setdefault("TQDM_DISABLE", "1")

from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from lightning.pytorch import seed_everything  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from spp.atomic import remove_stale_temporaries  # noqa: E402
from spp.cli_help import register_help  # noqa: E402
from spp.errors import UserError, cli_errors, to_job  # noqa: E402
from spp.eval.harness import zero_shot_mean  # noqa: E402
from spp.eval.job_config import EvalJobConfig, register_configs  # noqa: E402
from spp.eval.run_name import register_eval_resolvers  # noqa: E402
from spp.eval.runner import preflight, run_eval_job  # noqa: E402
from spp.eval.tables import markdown_report  # noqa: E402
from spp.loggers import save_and_print_config  # noqa: E402
from spp.overrides import checked_overrides  # noqa: E402
from spp.quiet import quiet_lightning  # noqa: E402
from spp.run_lock import hold_run_dir  # noqa: E402

register_configs()
register_help()
register_eval_resolvers()


@checked_overrides("eval.py", EvalJobConfig)
@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    """Run one evaluation; returns the 7-task mean accuracy, else the perplexity (the sweep objective)."""
    with cli_errors("eval.py"):
        job: EvalJobConfig = to_job(cfg, EvalJobConfig)
        try:
            preflight(job)
        except UserError:
            raise
        except (ValueError, FileNotFoundError) as err:
            raise UserError.from_message(str(err)) from err
        out_dir = Path(job.output_dir or HydraConfig.get().runtime.output_dir)
        with hold_run_dir(out_dir, "output_dir"):  # one job per output folder (spp.run_lock)
            remove_stale_temporaries(out_dir, [Path(job.cache_dir).expanduser() / "pruning"])
            save_and_print_config(cfg, out_dir, show=job.print_config)
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


if __name__ == "__main__":
    main()
