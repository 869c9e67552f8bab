"""The recovery study: learning rates chosen per setting on validation perplexity, seeds, paired zero-shot,
the new baselines and recovery per CPU-minute, read from the raw run files under
``experiments/results/runs/recovery`` (written by ``experiments/recovery/run.sh``).

Modules: :mod:`.records` (reading the runs), :mod:`.selection` (grids, the chosen rate, extending a grid past a chosen
endpoint), :mod:`.stats` (paired intervals over seeds and windows: the small-sample interval the verdicts use and the
two-level bootstrap), :mod:`.coverage` (their coverage simulated on the study's per-window data), :mod:`.tables` (the
Markdown report) with its sections :mod:`.zero_shot`, :mod:`.seed_selection`, :mod:`.distillation` and
:mod:`.recovery`, :mod:`.figure` (the figure and the data it plots). Command line: ``python -m lab.recovery --help``.
"""
