"""Checks that run before any weight is loaded (``docs/errors.md``), from the model's ``config.json`` / GGUF header /
``arch`` block alone: each failure is a :class:`spp.errors.UserError` naming the config key and the fix, so a check
that passes here cannot fail hours later inside pruning or training. Resume checks: ``spp.training.resume_checks``.
"""
