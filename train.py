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

The way in: ``spp/commands/train.py`` — ``run`` (``plan=true``, the sweep checks) and ``run_job`` (the job's names
resolved once into a frozen ``Run``, ``spp/training/run.py``, which every phase above reads; the phases under the
run directory's lock, then ``summary.json``, W&B and the guards' verdict); the entry point the four
commands share (environment, ``--help``, the override check, Hydra, one-line errors) is ``spp/commands/entry.py``.
"""

from spp.commands.entry import hydra_entry
from spp.commands.train import COMMAND, run_job  # noqa: F401 - the job as one call: ``from train import run_job``

main = hydra_entry(COMMAND)

if __name__ == "__main__":
    main()
