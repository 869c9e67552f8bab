"""``prune.py``: prune a model alone and write it, with its mask summary, report and timings."""

from __future__ import annotations

from pathlib import Path

from spp.atomic import remove_stale_temporaries
from spp.commands.entry import Command, hydra_output_dir
from spp.preflight.jobs import preflight_prune
from spp.pruning.config import PruneJobConfig, register_prune_schema
from spp.pruning.job import prune_job
from spp.run_lock import hold_run_dir
from spp.training.run import resolve_methods


def run(job: PruneJobConfig) -> None:
    """Resolve the job's pruner and reconstruction form once, check the job before any load, then prune into
    ``run_dir`` (else Hydra's run directory)."""
    methods = resolve_methods(job)
    preflight_prune(job, methods)
    out_dir = Path(job.run_dir or hydra_output_dir()).expanduser()
    with hold_run_dir(out_dir, "run_dir"):  # one job per output folder (spp.run_lock)
        remove_stale_temporaries(out_dir, [Path(job.cache_dir).expanduser() / "pruning"])
        prune_job(job, out_dir, methods)


COMMAND = Command("prune.py", "prune", PruneJobConfig, run, register_prune_schema)
"""``python prune.py ...``: composes ``conf/prune.yaml`` into :class:`PruneJobConfig` and runs :func:`run`."""
