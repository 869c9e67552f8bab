"""The lab: the studies and paper tables built on ``spp``, kept out of the product package.

- sweep planning and paper tables: ``python -m lab.plan <train.py -m overrides>``,
  ``python -m lab.collect_summaries <table> <dir>`` (``experiments/plan.py`` and ``experiments/collect_summaries.py``
  are the same commands as scripts), Table 1's parameter counts (:mod:`lab.table1_params`);
- the studies on SmolLM2-135M, each read from its committed raw runs: the methods after one epoch
  (:mod:`lab.methods_one_epoch`), the recovery study (:mod:`lab.recovery`), block-wise reconstruction
  (:mod:`lab.reconstruction`);
- the benchmarks' helpers (:mod:`lab.bench`).
"""
