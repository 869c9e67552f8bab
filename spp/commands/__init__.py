"""The four commands (``train.py``, ``prune.py``, ``eval.py``, ``generate.py``), one shape each.

A command is a :class:`spp.commands.entry.Command`: its script name, its primary config in ``conf/``, the typed
job config that config is converted into, and a ``run(job)`` function; ``spp/commands/<name>.py`` holds them.
:func:`spp.commands.entry.main` is the one Hydra entry point they share (environment defaults, ``--help``, the
override check, Hydra's composition, one-line errors, the conversion to the typed job); each root script is a few
lines that call it. Nothing here is imported by the rest of ``spp``.
"""
