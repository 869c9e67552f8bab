"""Turning Alpaca records into token ids and loss labels, exactly as the authors' alpaca-lora code does."""

from __future__ import annotations

from collections.abc import Sequence

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from spp.data.prompts import full_prompt, user_prompt
from spp.data.records import AlpacaRecord

IGNORE_INDEX = -100
"""Label value that ``torch.nn.CrossEntropyLoss`` (and HF causal LMs) leave out of the loss."""

Feature = dict[str, list[int]]


def carries_loss(labels: list[int]) -> bool:
    """Whether a feature has a token that counts in the causal-LM loss (labels shift by one: the first never counts).

    A batch of features without one would give ``0 / 0 = nan``."""
    return any(t != IGNORE_INDEX for t in labels[1:])


def tokenize_records(
    records: Sequence[AlpacaRecord],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int = 512,
    add_eos: bool = True,
    train_on_inputs: bool = True,
    chunk_size: int = 1000,
    progress: bool = True,
) -> list[Feature]:
    """Tokenise records into ``input_ids`` / ``attention_mask`` / ``labels`` lists, truncated at ``max_length``.

    EOS is appended when there is room. With ``train_on_inputs=False`` the user prompt's labels become -100, so only
    the response carries loss."""
    if add_eos and tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token; set data.add_eos=false or use a "
                         "tokenizer with an EOS token")
    eos_id = int(tokenizer.eos_token_id) if add_eos else None
    features: list[Feature] = []
    bar = tqdm(total=len(records), desc="tokenising Alpaca", unit="rec", disable=not progress, leave=False)
    for start in range(0, len(records), chunk_size):
        chunk = records[start : start + chunk_size]
        full = tokenizer(
            [full_prompt(r.instruction, r.input, r.output) for r in chunk],
            truncation=True,
            max_length=max_length,
        )["input_ids"]
        prompt_lengths = [0] * len(chunk)
        if not train_on_inputs:
            prompts = tokenizer(
                [user_prompt(r.instruction, r.input) for r in chunk], truncation=True, max_length=max_length
            )["input_ids"]
            prompt_lengths = [len(p) for p in prompts]
        for ids, n_prompt in zip(full, prompt_lengths, strict=True):
            ids = list(ids)
            if eos_id is not None and len(ids) < max_length and (not ids or ids[-1] != eos_id):
                ids.append(eos_id)
            n_masked = min(n_prompt, len(ids))
            labels = [IGNORE_INDEX] * n_masked + ids[n_masked:]
            features.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels})
        bar.update(len(chunk))
    bar.close()
    return features
