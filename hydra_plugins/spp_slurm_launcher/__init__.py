"""``hydra/launcher=slurm``'s launcher: submitit's Slurm launcher that plans every job of the array before
``sbatch`` (``spp.slurm``, ``docs/plan.md``). Hydra accepts launchers only from the ``hydra_plugins`` namespace
package, so the class lives here; the logic is in ``spp.slurm``, imported when a sweep is launched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


class PlannedSlurmLauncher(SlurmLauncher):
    """``SlurmLauncher`` that sets or checks ``mem_gb`` (and the GPU and task counts) from every job's run plan
    before submitting the array (:func:`spp.slurm.plan_array`)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        """Plan every job, set ``mem_gb`` (or refuse in one line, exit 2), then submit as ``SlurmLauncher``."""
        from spp.slurm import plan_array

        assert self.config is not None and self.hydra_context is not None
        self.params.update(plan_array(self.hydra_context.config_loader, self.config, job_overrides, self.params))
        return super().launch(job_overrides, initial_job_idx)
