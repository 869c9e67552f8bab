"""Dynamic per-batch padding of tokenised examples (labels padded with -100)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spp.data.tokenization import IGNORE_INDEX, Feature


@dataclass(frozen=True)
class PadCollator:
    """Pad a list of features to the longest one (rounded up to ``pad_to_multiple_of``); labels pad with -100.

    A batch with no loss-carrying label is refused: its loss would be ``nan``, which the guards would blame on the
    learning rate. Unlike ``DataCollatorForSeq2Seq`` it holds only the pad id, so it never touches the shared
    tokenizer's padding side and pickles cheaply into DataLoader workers."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    padding_side: str = "right"

    def __call__(self, features: Sequence[Feature]) -> dict[str, torch.Tensor]:
        """Return ``input_ids``, ``attention_mask`` and ``labels`` as ``(batch, length)`` LongTensors."""
        if not features:
            raise ValueError("cannot collate an empty batch")
        length = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        pad_values = {"input_ids": self.pad_token_id, "attention_mask": 0, "labels": IGNORE_INDEX}
        batch: dict[str, torch.Tensor] = {}
        for key, pad_value in pad_values.items():
            out = torch.full((len(features), length), pad_value, dtype=torch.long)
            for row, feature in enumerate(features):
                values = torch.as_tensor(feature[key], dtype=torch.long)
                start = 0 if self.padding_side == "right" else length - len(values)
                out[row, start : start + len(values)] = values
            batch[key] = out
        if not bool((batch["labels"][:, 1:] != IGNORE_INDEX).any()):
            raise ValueError(f"a batch of {len(features)} example(s) has no token that carries loss (its causal-LM "
                             "loss would be 0/0 = nan); such examples are dropped when the data is tokenised "
                             "(spp.data.tokenization.carries_loss)")
        return batch
