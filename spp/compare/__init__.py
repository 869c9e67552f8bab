"""Compare the runs of any sweep: ``python -m spp.compare <folder of runs or a multirun folder>``.

One row per run keyed by the config keys that differ; matplotlib is imported only when a figure is drawn."""
