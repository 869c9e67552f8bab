"""The four commands (``train.py``, ``prune.py``, ``eval.py``, ``generate.py``), one ``Command``
each, sharing the Hydra entry point :func:`spp.commands.entry.hydra_entry`. Nothing else in ``spp`` imports this."""
