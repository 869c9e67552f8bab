"""With ``data.train_on_inputs=false``, a prompt that fills ``data.max_length`` leaves no token
that carries loss. Such records are dropped at tokenisation and counted in the data summary (``summary.json`` →
``data.dropped_no_loss_records``); a batch without a loss-carrying token cannot reach the model (it would give a
``nan`` loss that the guards blame on the learning rate); if no training record is left, one line names
``data.max_length`` and ``data.train_on_inputs``.

The tiny tokenizer is one token per byte, so prompt lengths are exact.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from train_helpers import tiny_job

from spp.data.alpaca import AlpacaDataModule
from spp.data.collate import PadCollator
from spp.data.config import DataConfig
from spp.data.prompts import user_prompt
from spp.data.tokenization import IGNORE_INDEX, carries_loss
from spp.errors import UserError
from spp.models.tiny import tiny_llama
from train import run_job

MAX_LENGTH = 256
SHORT = {"instruction": "Add 2 and 3.", "input": "", "output": "The sum is 5."}


def prompt_of_length(n: int) -> dict[str, str]:
    """A record whose user prompt (template + instruction) is exactly ``n`` byte-tokens long."""
    base = len(user_prompt("").encode())
    record = {"instruction": "x" * (n - base), "input": "", "output": "y"}
    assert len(user_prompt(record["instruction"]).encode()) == n
    return record


def write_records(path: Path, records: list[dict[str, str]]) -> Path:
    path.write_text(json.dumps(records))
    return path


def module(tiny_tok, source: Path, **overrides) -> AlpacaDataModule:
    cfg = DataConfig(source=str(source), max_length=MAX_LENGTH, train_on_inputs=False, val_size=0,
                     train_batch_size=2, shuffle=False)
    dm = AlpacaDataModule(tiny_tok, cfg, progress=False, **overrides)
    dm.setup("fit")
    return dm


def test_prompts_filling_max_length_are_dropped_and_counted(tmp_path, tiny_tok, caplog):
    records = [SHORT, prompt_of_length(MAX_LENGTH + 40), SHORT, prompt_of_length(MAX_LENGTH),
               prompt_of_length(MAX_LENGTH - 1), SHORT]
    with caplog.at_level("WARNING"):
        dm = module(tiny_tok, write_records(tmp_path / "data.json", records))
    # the prompt of exactly max_length tokens leaves nothing; one token shorter leaves the first response token
    assert len(dm.train_dataset) == 4
    assert [r.instruction for r in dm.train_records] == [SHORT["instruction"]] * 2 + ["x" * (MAX_LENGTH - 1 - len(
        user_prompt("").encode()))] + [SHORT["instruction"]]
    assert dm.summary()["dropped_no_loss_records"] == {"train": 2, "val": 0}
    assert "dropped 2 training" in caplog.text and "data.max_length=256" in caplog.text
    assert all(carries_loss(f["labels"]) for f in dm.train_dataset.features)
    model = tiny_llama(seed=0)
    for batch in dm.train_dataloader():
        with torch.no_grad():
            assert math.isfinite(float(model(**batch).loss))


def test_dropping_applies_to_the_validation_split_too(tmp_path, tiny_tok):
    records = [SHORT] * 8 + [prompt_of_length(MAX_LENGTH + 1)] * 12
    dm = module(tiny_tok, write_records(tmp_path / "data.json", records), val_size=10, max_val_fraction=0.5)
    dropped = dm.summary()["dropped_no_loss_records"]
    assert dropped["train"] + dropped["val"] == 12 and dropped["val"] > 0
    assert len(dm.train_dataset) + len(dm.val_dataset) == 8


def test_train_on_inputs_keeps_long_prompts(tmp_path, tiny_tok):
    records = [SHORT, prompt_of_length(MAX_LENGTH + 40)]
    dm = module(tiny_tok, write_records(tmp_path / "data.json", records), train_on_inputs=True)
    assert len(dm.train_dataset) == 2 and dm.summary()["dropped_no_loss_records"] == {"train": 0, "val": 0}


def test_no_record_left_is_one_line_naming_the_keys(tmp_path, tiny_tok):
    records = [prompt_of_length(MAX_LENGTH + 5)] * 3
    with pytest.raises(UserError) as exc:
        module(tiny_tok, write_records(tmp_path / "data.json", records))
    assert exc.value.key == "data.max_length"
    assert "data.max_length=256" in str(exc.value) and "data.train_on_inputs=true" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_batch_without_a_loss_token_is_refused(tiny_tok):
    masked = {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [IGNORE_INDEX] * 3}
    first_only = {"input_ids": [5, 6], "attention_mask": [1, 1], "labels": [5, IGNORE_INDEX]}  # shifted away
    with pytest.raises(ValueError, match="no token that carries loss"):
        PadCollator(tiny_tok.pad_token_id)([masked, first_only])
    kept = {"input_ids": [5, 6], "attention_mask": [1, 1], "labels": [IGNORE_INDEX, 6]}
    batch = PadCollator(tiny_tok.pad_token_id)([masked, kept])
    assert torch.isfinite(tiny_llama(seed=0)(**batch).loss)


def test_training_on_data_with_long_prompts_has_no_nan_loss(tmp_path):
    """Most records are prompts longer than data.max_length; one per batch: before, the first such batch gave a nan
    loss and the run stopped ("lower trainer.lr")."""
    records = [SHORT if i % 4 == 0 else prompt_of_length(MAX_LENGTH + 30 + i) for i in range(40)]
    source = write_records(tmp_path / "long_prompts.json", records)
    summary = run_job(tiny_job(tmp_path, f"data.source={source}", f"data.max_length={MAX_LENGTH}",
                               "data.train_on_inputs=false", "data.train_batch_size=1", "data.val_size=2",
                               "data.max_examples=null", "trainer.max_steps=6", "guards.loss_must_fall=false"))
    assert summary["status"] == "ok"
    assert all(math.isfinite(v) for v in summary["losses"]["train"]) and len(summary["losses"]["train"]) == 6
    dropped = summary["data"]["dropped_no_loss_records"]
    assert dropped["train"] + dropped["val"] == 30
    assert summary["data"]["train_examples"] + summary["data"]["val_examples"] == 10
