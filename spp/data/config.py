"""Structured config of the ``data`` group (``conf/data/*.yaml``): Alpaca records, tokenisation, split, batches."""

from __future__ import annotations

import math
from dataclasses import dataclass

from spp.job_base import Validated

HUB_PREFIX = "hub:"
"""``source`` values starting with this prefix name a Hugging Face hub dataset (needs the hub)."""


@dataclass
class DataConfig(Validated):
    """Instruction-tuning data settings (defaults follow the authors' alpaca-lora based ``finetune.py``).

    Attributes:
        name: Short name used in run names and tables (``alpaca_sample``, ``alpaca_cleaned``, ``alpaca_hub``).
        source: Where the records are. One of: a JSON array / JSON-lines file or a directory of split files
            (``*.json``/``*.jsonl``, concatenated in numeric order of the numbers in their names), given as an
            absolute path or as a path relative to the data roots (``data_dir``, ``../shared/data``, repo
            ``data/``); or ``hub:<dataset id>`` (e.g. ``hub:yahma/alpaca-cleaned``, needs the hub).
        hub_split: Split loaded from a hub dataset.
        max_length: Token budget per example; longer prompts are truncated (authors' ``cutoff_len``).
        add_eos: Append the tokenizer's EOS to each example when it is not truncated (authors' default).
        train_on_inputs: ``True`` (authors' default): the loss covers the whole prompt. ``False``: the
            instruction/input part of the prompt is masked out of the loss (labels -100).
        val_size: Held-out validation records (authors: 2000). Scaled down for small data: the split holds
            ``min(val_size, floor(max_val_fraction * n))`` records, and at least 1 when ``val_size > 0`` and
            ``n >= 2``.
        max_val_fraction: Upper bound on the validation share of the records (see ``val_size``).
        max_examples: Use only the first ``max_examples`` valid records (before the split), for quick runs.
        seed: Seed of the train/validation split and of the per-epoch shuffling (authors: 42).
        train_batch_size: Per-device training micro-batch.
        eval_batch_size: Per-device validation batch.
        num_workers: DataLoader worker processes.
        pad_to_multiple_of: Pad each batch's length up to a multiple of this (authors: 8); ``None`` pads to
            the longest example of the batch only.
        padding_side: ``right`` (default; positions stay 0..L-1 for every example) or ``left`` (authors).
        shuffle: Shuffle the training examples every epoch.
    """

    name: str = "alpaca_sample"
    source: str = "alpaca/cleaned_partial/alpaca_data_cleaned_0.json"
    hub_split: str = "train"
    max_length: int = 512
    add_eos: bool = True
    train_on_inputs: bool = True
    val_size: int = 2000
    max_val_fraction: float = 0.1
    max_examples: int | None = None
    seed: int = 42
    train_batch_size: int = 8
    eval_batch_size: int = 8
    num_workers: int = 0
    pad_to_multiple_of: int | None = None
    padding_side: str = "right"
    shuffle: bool = True

    def validate(self) -> DataConfig:
        """Check value ranges and return ``self``; a ``ValueError`` names the offending ``data.*`` key."""
        checks = [
            (self.max_length >= 2, f"data.max_length must be >= 2, got {self.max_length}"),
            (self.val_size >= 0, f"data.val_size must be >= 0, got {self.val_size}"),
            (
                0.0 <= self.max_val_fraction < 1.0,
                f"data.max_val_fraction must be in [0, 1), got {self.max_val_fraction}",
            ),
            (
                self.max_examples is None or self.max_examples >= 1,
                f"data.max_examples must be null or >= 1, got {self.max_examples}",
            ),
            (self.train_batch_size >= 1, f"data.train_batch_size must be >= 1, got {self.train_batch_size}"),
            (self.eval_batch_size >= 1, f"data.eval_batch_size must be >= 1, got {self.eval_batch_size}"),
            (self.num_workers >= 0, f"data.num_workers must be >= 0, got {self.num_workers}"),
            (
                self.pad_to_multiple_of is None or self.pad_to_multiple_of >= 1,
                f"data.pad_to_multiple_of must be null or >= 1, got {self.pad_to_multiple_of}",
            ),
            (
                self.padding_side in ("right", "left"),
                f"data.padding_side must be 'right' or 'left', got {self.padding_side!r}",
            ),
            (bool(self.source), "data.source is empty; give a file, a directory or hub:<dataset id>"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        return self


def validation_split_size(n_records: int, val_size: int, max_val_fraction: float) -> int:
    """Held-out records for ``n_records``: ``min(val_size, floor(max_val_fraction * n))``, at least 1 when
    ``val_size > 0`` and ``n >= 2``, at most ``n - 1``."""
    if val_size <= 0 or n_records < 2:
        return 0
    size = min(val_size, math.floor(max_val_fraction * n_records + 1e-9))
    return max(1, min(size, n_records - 1))
