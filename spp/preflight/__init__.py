"""Checks that run before any weight is loaded (``docs/errors.md``): every shape rule, data file and resume
setting a job will need, read from the model's ``config.json`` / GGUF header / ``arch`` block alone.

Each failed check raises :class:`spp.errors.UserError` naming the config key and the fix; ``cli_errors`` prints
it as one line. A check that passes here cannot fail hours later inside pruning or training.

- :mod:`spp.preflight.jobs`: ``preflight_train`` / ``preflight_prune``, what ``train.py`` / ``prune.py`` run.
- :mod:`spp.preflight.model_files`: the model's files (GGUF header, safetensors headers, ``config.json``,
  tokenizer files) and its arch fields.
- :mod:`spp.preflight.shapes`: the shape rules (the adapter method's own, N:M, sequence lengths) and the
  ``*.targets`` against the architecture's layers.
- :mod:`spp.preflight.data_files`: the training, calibration and perplexity data files.

The resume checks live next to the checkpoint code (:mod:`spp.training.resume_checks`), the removal of
temporaries killed runs left next to the code that makes them (:func:`spp.atomic.remove_stale_temporaries`).
"""
