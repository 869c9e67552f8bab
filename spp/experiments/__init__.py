"""Library code of the paper-table experiments: sweep planning (dry runs) and collecting runs into tables.

``python -m spp.experiments.plan <train.py -m overrides>`` and
``python -m spp.experiments.collect_summaries <table> <dir>`` (``experiments/plan.py`` and
``experiments/collect_summaries.py`` are the same commands as scripts).
"""
