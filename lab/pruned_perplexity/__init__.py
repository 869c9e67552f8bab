"""The pruned-perplexity study on SmolLM2-135M: every pruner (magnitude, Wanda, SparseGPT, DS⊘T, RIA), each also
with OWL's layer-wise ratios, at unstructured 50 %, 70 % and 2:4; WikiText-2 perplexity with its bootstrap interval
over windows. ``runs.py`` runs one row per raw file (``experiments/results/runs/pruned_perplexity/``), ``report.py``
writes the report from those files alone (``python -m lab.pruned_perplexity run|report``)."""
