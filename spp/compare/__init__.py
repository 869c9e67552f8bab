"""Compare the runs of any sweep: ``python -m spp.compare <folder of runs or a multirun folder>``.

:func:`~spp.compare.runs.find_runs` reads every ``train.py`` ``summary.json`` below a folder,
:func:`~spp.compare.runs.swept_keys` finds the config keys whose values differ between the runs (from each run's
``.hydra/overrides.yaml``, read against its recorded config), :func:`~spp.compare.table.compare_rows` makes one row
per run keyed by them (perplexity with its 95 % interval, sparsity measured after the merge, trainable parameters,
time) and :func:`~spp.compare.figure.plot_metric` draws a metric against a swept key. Nothing here imports
matplotlib until a figure is drawn."""
