"""Prune a model alone: ``python prune.py model=smollm2_135m pruner=wanda sparsity=nm2_4 calibration=c4``.

Writes to the run directory: ``model/`` (pruned model via ``save_pretrained`` + tokenizer), ``mask_summary.json``
(per-layer and overall exact-zero sparsity, N:M audit), ``report.md`` and ``timing.json``. The pruning itself goes
through the cache (``use_cache=false`` to bypass it); two jobs with the same key prune once (file lock). The job
is :func:`spp.pruning.job.prune_job`, run by ``spp/commands/prune.py`` (the entry point: ``spp/commands/entry.py``).
"""

from spp.commands.entry import hydra_entry
from spp.commands.prune import COMMAND

main = hydra_entry(COMMAND)

if __name__ == "__main__":
    main()
