"""Prune a model alone: ``python prune.py model=smollm2_135m pruner=wanda sparsity=nm2_4 calibration=c4``.

Writes to the run directory: ``model/`` (pruned model via ``save_pretrained`` + tokenizer), ``mask_summary.json``
(per-layer and overall exact-zero sparsity, N:M audit), ``report.md`` and ``timing.json``. The pruning itself goes
through the cache (``use_cache=false`` to bypass it); two jobs with the same key prune once (file lock). The job
is :func:`spp.pruning.job.run`.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from spp.atomic import remove_stale_temporaries
from spp.cli_help import register_help
from spp.errors import cli_errors, to_job
from spp.overrides import checked_overrides
from spp.preflight.jobs import preflight_prune
from spp.pruning.config import PruneJobConfig, register_prune_configs
from spp.pruning.job import run
from spp.run_lock import hold_run_dir

register_prune_configs()
register_help()


@checked_overrides("prune.py", PruneJobConfig)
@hydra.main(version_base="1.3", config_path="conf", config_name="prune")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: convert the composed config once, then run the job."""
    with cli_errors("prune.py"):
        job: PruneJobConfig = to_job(cfg, PruneJobConfig)
        preflight_prune(job)
        out_dir = Path(job.output_dir or HydraConfig.get().runtime.output_dir)
        with hold_run_dir(out_dir, "output_dir"):  # one job per output folder (spp.run_lock)
            remove_stale_temporaries(out_dir, [Path(job.cache_dir).expanduser() / "pruning"])
            run(job, out_dir)


if __name__ == "__main__":
    main()
