"""Dynamic per-batch padding of tokenised examples (labels padded with -100)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spp.data.tokenization import IGNORE_INDEX, Feature


@dataclass(frozen=True)
class PadCollator:
    """Pad a list of features to the longest one (rounded up to ``pad_to_multiple_of``).

    A batch with no loss-carrying label (every label -100 after the causal shift) is refused: its loss would be
    ``nan``, which the guards would then blame on the learning rate.

    Same result as ``transformers.DataCollatorForSeq2Seq(label_pad_token_id=-100)`` for these features, but it
    holds only the pad id (no tokenizer), so it neither reads nor changes the shared tokenizer's padding side
    and pickles cheaply into DataLoader workers.

    Attributes:
        pad_token_id: Id written into padded ``input_ids`` positions (their attention mask is 0).
        pad_to_multiple_of: Round the padded length up to a multiple of this (``None``: no rounding).
        padding_side: ``right`` or ``left``.
    """

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
                if self.padding_side == "right":
                    out[row, : len(values)] = values
                else:
                    out[row, length - len(values) :] = values
            batch[key] = out
        if not bool((batch["labels"][:, 1:] != IGNORE_INDEX).any()):
            raise ValueError(f"a batch of {len(features)} example(s) has no token that carries loss (its causal-LM "
                             "loss would be 0/0 = nan); such examples are dropped when the data is tokenised "
                             "(spp.data.tokenization.carries_loss)")
        return batch
