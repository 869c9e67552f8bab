"""Targeted filters for library boilerplate, so a job's log says what the job does.

Each filter drops one exact message (Lightning's start-up lines and tips, warnings that do not apply here such as
"your dataloader is not resumable", torch's ``LeafSpec`` deprecation); nothing else is touched."""

from __future__ import annotations

import logging
import re
import warnings

QUIET_PREFIXES = ("GPU available", "TPU available", "HPU available", "💡 Tip", "`Trainer(", "Seed set to",
                  "Loading `train_dataloader` to estimate")
"""Start of the Lightning info lines that :func:`quiet_lightning` drops."""

QUIET_WARNINGS = (
    r"When using the `ThroughputMonitor`, you need to define a `flops_per_batch`",
    r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not resumable",
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)
"""Regular expressions (matched at a warning message's start) that :func:`quiet_lightning` ignores."""

LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                     "lightning.fabric.utilities.seed", "lightning.pytorch.utilities.seed")


def _drop_boilerplate(record: logging.LogRecord) -> bool:
    """The logging filter: drop a record whose message starts with one of :data:`QUIET_PREFIXES`."""
    return not re.sub(r"^\[rank: \d+\] ", "", str(record.msg)).startswith(QUIET_PREFIXES)


def quiet_lightning() -> None:
    """Install the filters (idempotent)."""
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        if _drop_boilerplate not in logger.filters:
            logger.addFilter(_drop_boilerplate)
    for pattern in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
