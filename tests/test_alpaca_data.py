"""AlpacaDataModule: template text, tokenisation (EOS, truncation, prompt masking), padding, split, bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from transformers import DataCollatorForSeq2Seq

from spp.data.alpaca import AlpacaDataModule
from spp.data.collate import PadCollator
from spp.data.config import DataConfig, validation_split_size
from spp.data.prompts import full_prompt, user_prompt
from spp.data.records import AlpacaRecord, load_alpaca_records, read_json_records
from spp.data.tokenization import IGNORE_INDEX, tokenize_records
from spp.paths import CONF_DIR

SAMPLE = "alpaca/cleaned_partial/alpaca_data_cleaned_0.json"
SHORT = AlpacaRecord(instruction="Add 2 and 3.", input="", output="5")
WITH_INPUT = AlpacaRecord(instruction="Translate to French.", input="cat", output="chat")


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_template_without_input_is_the_alpaca_text() -> None:
    assert user_prompt("Add 2 and 3.") == (
        "Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\nAdd 2 and 3.\n\n### Response:\n"
    )
    assert full_prompt("Add 2 and 3.", "", "5") == user_prompt("Add 2 and 3.") + "5"


def test_template_with_input_is_the_alpaca_text() -> None:
    assert full_prompt("Translate to French.", "cat", "chat") == (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n### Instruction:\nTranslate to French."
        "\n\n### Input:\ncat\n\n### Response:\nchat"
    )


def test_eos_appended_and_labels_cover_everything(tiny_tok) -> None:
    (feature,) = tokenize_records([SHORT], tiny_tok, max_length=512, progress=False)
    text = full_prompt(SHORT.instruction, SHORT.input, SHORT.output)
    n_bytes = len(text.encode("utf-8"))  # the tiny tokenizer is one token per byte
    assert len(feature["input_ids"]) == n_bytes + 1
    assert feature["input_ids"][:-1] == tiny_tok(text)["input_ids"]
    assert feature["input_ids"][-1] == tiny_tok.eos_token_id
    assert feature["labels"] == feature["input_ids"]
    assert feature["attention_mask"] == [1] * (n_bytes + 1)


def test_truncation_length_and_eos_only_when_room(tiny_tok) -> None:
    n_bytes = len(full_prompt(SHORT.instruction, SHORT.input, SHORT.output).encode("utf-8"))
    cut, exact, roomy = (
        tokenize_records([SHORT] * 1, tiny_tok, max_length=40, progress=False)
        + tokenize_records([SHORT], tiny_tok, max_length=n_bytes, progress=False)
        + tokenize_records([SHORT], tiny_tok, max_length=n_bytes + 1, progress=False)
    )
    assert len(cut["input_ids"]) == 40 and tiny_tok.eos_token_id not in cut["input_ids"]
    assert len(exact["input_ids"]) == n_bytes and exact["input_ids"][-1] != tiny_tok.eos_token_id
    assert len(roomy["input_ids"]) == n_bytes + 1 and roomy["input_ids"][-1] == tiny_tok.eos_token_id
    no_eos = tokenize_records([SHORT], tiny_tok, max_length=512, add_eos=False, progress=False)[0]
    assert len(no_eos["input_ids"]) == n_bytes


@pytest.mark.parametrize("record", [SHORT, WITH_INPUT])
def test_train_on_inputs_false_masks_exactly_the_prompt(tiny_tok, record: AlpacaRecord) -> None:
    (feature,) = tokenize_records([record], tiny_tok, train_on_inputs=False, progress=False)
    n_prompt = len(user_prompt(record.instruction, record.input).encode("utf-8"))
    n_output = len(record.output.encode("utf-8"))
    labels, ids = feature["labels"], feature["input_ids"]
    assert labels.count(IGNORE_INDEX) == n_prompt
    assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:]
    assert len(labels) - n_prompt == n_output + 1  # response bytes + EOS carry the loss


def test_padding_labels_and_mask(tiny_tok) -> None:
    features = tokenize_records([SHORT, WITH_INPUT], tiny_tok, train_on_inputs=False, progress=False)
    lengths = [len(f["input_ids"]) for f in features]
    batch = PadCollator(tiny_tok.pad_token_id)(features)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert all(t.dtype == torch.long and t.shape == (2, max(lengths)) for t in batch.values())
    short = lengths.index(min(lengths))
    pad = max(lengths) - min(lengths)
    assert batch["attention_mask"][short].tolist() == [1] * min(lengths) + [0] * pad
    assert batch["labels"][short, min(lengths) :].tolist() == [IGNORE_INDEX] * pad
    assert batch["input_ids"][short, min(lengths) :].tolist() == [tiny_tok.pad_token_id] * pad
    reference = DataCollatorForSeq2Seq(tiny_tok, label_pad_token_id=IGNORE_INDEX, return_tensors="pt")(
        [dict(f) for f in features]
    )
    for key in batch:
        assert torch.equal(batch[key], reference[key]), key
    rounded = PadCollator(tiny_tok.pad_token_id, pad_to_multiple_of=64)(features)
    assert rounded["input_ids"].shape[1] == -(-max(lengths) // 64) * 64
    left = PadCollator(tiny_tok.pad_token_id, padding_side="left")(features)
    assert left["attention_mask"][short].tolist() == [0] * pad + [1] * min(lengths)


@pytest.mark.parametrize(
    ("n", "val_size", "fraction", "expected"),
    [
        (1551, 2000, 0.1, 155),
        (50921, 2000, 0.1, 2000),
        (300, 2000, 0.1, 30),
        (5, 2000, 0.1, 1),
        (1, 2000, 0.1, 0),
        (100, 0, 0.1, 0),
        (100, 7, 0.1, 7),
    ],
)
def test_validation_split_rule(n: int, val_size: int, fraction: float, expected: int) -> None:
    assert validation_split_size(n, val_size, fraction) == expected


def test_split_sizes_disjoint_and_seeded(tiny_tok, sample_data_dir: Path) -> None:
    kwargs = {"data_dir": sample_data_dir, "progress": False, "max_examples": 300, "max_length": 64}
    dm = AlpacaDataModule(tiny_tok, DataConfig(source=SAMPLE), **kwargs)
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (270, 30)
    first_300 = dm.record_set.records[:300]
    positions = {id(r): i for i, r in enumerate(first_300)}
    train_pos = [positions[id(r)] for r in dm.train_records]
    val_pos = [positions[id(r)] for r in dm.val_records]
    assert sorted(train_pos + val_pos) == list(range(300)) and train_pos == sorted(train_pos)
    same = AlpacaDataModule(tiny_tok, DataConfig(source=SAMPLE), **kwargs)
    same.setup("fit")
    assert same.val_dataset.features == dm.val_dataset.features
    other = AlpacaDataModule(tiny_tok, DataConfig(source=SAMPLE, seed=1), **kwargs)
    other.setup("fit")
    assert other.val_dataset.features != dm.val_dataset.features
    assert dm.train_dataset.num_tokens == sum(len(f["input_ids"]) for f in dm.train_dataset.features) == 270 * 64


def test_full_sample_split_and_loader(tiny_tok, sample_data_dir: Path) -> None:
    dm = AlpacaDataModule(tiny_tok, source=SAMPLE, data_dir=sample_data_dir, progress=False, train_batch_size=4)
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (1396, 155)
    loader = dm.train_dataloader()
    batch = next(iter(loader))
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape == (4, int(lengths.max()))
    assert torch.equal(batch["labels"] == IGNORE_INDEX, batch["attention_mask"] == 0)
    loader.sampler.set_epoch(0)
    first = list(loader.sampler)
    loader.sampler.set_epoch(1)
    assert list(loader.sampler) != first and sorted(first) == list(range(1396))
    assert len(dm.val_dataloader()) == -(-155 // dm.cfg.eval_batch_size)


def test_malformed_records_are_skipped_counted_and_listed(tmp_path: Path, tiny_tok, caplog) -> None:
    good = {"instruction": "Say hi.", "input": "", "output": "hi"}
    raw = [
        good,
        {"input": "", "output": "no instruction"},
        {"instruction": "Numbers", "input": "", "output": 5},
        good,
        {"instruction": "List input", "input": ["a"], "output": "x"},
        "not an object",
        {"instruction": "No input key is fine", "output": "ok"},
        {"instruction": "Empty output", "input": "", "output": "  "},
    ]
    path = write_json(tmp_path / "bad.json", raw)
    with caplog.at_level(logging.WARNING, logger="spp.data.records"):
        records = load_alpaca_records(str(path))
    assert [s.index for s in records.skipped] == [1, 2, 4, 5, 7]
    assert [s.reason for s in records.skipped] == [
        "missing 'instruction'",
        "'output' is int, expected str",
        "'input' is list, expected str",
        "expected an object, got str",
        "empty 'output'",
    ]
    assert len(records.records) == 3 and records.records[2].input == ""
    (message,) = [r.getMessage() for r in caplog.records]
    assert "skipped 5 malformed" in message and "bad.json[1]" in message and "bad.json[7]" in message
    dm = AlpacaDataModule(tiny_tok, source=str(path), val_size=0, progress=False)
    dm.setup("fit")
    assert len(dm.train_dataset) == 3 and [s.index for s in dm.record_set.skipped] == [1, 2, 4, 5, 7]
    assert dm.summary()["skipped_records"] == 5


def test_invalid_json_error_names_the_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "c" "output": "d"}\n]\n')
    with pytest.raises(ValueError, match=r"broken\.json: invalid JSON at line 3, column 23"):
        read_json_records(broken)
    lines = tmp_path / "broken.jsonl"
    lines.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl: invalid JSON at line 2"):
        load_alpaca_records(str(lines))


def test_jsonl_source_and_directory_in_numeric_order(tmp_path: Path) -> None:
    (tmp_path / "splits").mkdir()
    for i in (1, 10, 2, 9):
        write_json(tmp_path / "splits" / f"part_{i}.json", [{"instruction": f"file {i}", "output": "o"}])
    (tmp_path / "splits" / "notes.txt").write_text("ignored")
    records = load_alpaca_records(str(tmp_path / "splits"))
    assert [r.instruction for r in records.records] == ["file 1", "file 2", "file 9", "file 10"]
    assert [Path(s).name for s in records.sources] == ["part_1.json", "part_2.json", "part_9.json", "part_10.json"]
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text('{"instruction": "a", "output": "b"}\n\n{"instruction": "c", "input": "d", "output": "e"}\n')
    assert load_alpaca_records(str(jsonl)).records == [AlpacaRecord("a", "", "b"), AlpacaRecord("c", "d", "e")]


def test_bad_config_and_missing_source_fail_early(tiny_tok, sample_data_dir: Path) -> None:
    with pytest.raises(TypeError, match="max_lenght"):
        AlpacaDataModule(tiny_tok, max_lenght=12)
    with pytest.raises(ValueError, match="data.padding_side"):
        AlpacaDataModule(tiny_tok, padding_side="middle")
    with pytest.raises(ValueError, match="data.max_length"):
        AlpacaDataModule(tiny_tok, DataConfig(max_length=0))
    dm = AlpacaDataModule(tiny_tok, source="alpaca/nowhere.json", data_dir=sample_data_dir)
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        dm.setup("fit")


def test_a_missing_data_root_names_where_it_came_from(tmp_path: Path, monkeypatch) -> None:
    from spp.paths import data_roots

    missing = tmp_path / "nowhere"
    monkeypatch.setenv("SPP_DATA_DIR", str(missing))
    with pytest.raises(FileNotFoundError, match=r"^SPP_DATA_DIR='.*nowhere' is not a directory; fix the environment"):
        data_roots()
    with pytest.raises(FileNotFoundError, match=r"^data_dir='.*nowhere' is not a directory; fix the config key"):
        data_roots(missing)  # the config key wins over the environment, and is the one named
    monkeypatch.delenv("SPP_DATA_DIR")
    assert data_roots(tmp_path) == [tmp_path.resolve()]  # negative control: an existing root is taken


def test_data_group_yamls_compose_against_the_schema() -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    names = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))
    assert {"alpaca_sample", "alpaca_cleaned", "alpaca_hub"} <= set(names)
    with initialize_config_dir(config_dir=str(CONF_DIR / "data"), version_base="1.3"):
        for name in names:
            node = OmegaConf.merge(OmegaConf.structured(DataConfig), compose(name))
            cfg = DataConfig(**OmegaConf.to_container(node, resolve=True)).validate()
            assert cfg.name == name
    assert cfg is not None


def test_lightning_fit_sees_seed_epoch_permutations(tiny_tok, sample_data_dir: Path) -> None:
    """Under ``Trainer.fit`` epoch e visits the training examples in ``randperm(n, seed + e)`` order."""
    import lightning as L

    from spp.models import tiny_llama

    class Recorder(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama()
            self.lengths: list[list[int]] = []

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            if batch_idx == 0:
                self.lengths.append([])
            self.lengths[-1].extend(batch["attention_mask"].sum(1).tolist())
            return self.model(**batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    dm = AlpacaDataModule(
        tiny_tok,
        source=SAMPLE,
        data_dir=sample_data_dir,
        progress=False,
        max_examples=40,
        train_batch_size=4,
    )
    module = Recorder()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, dm)
    assert trainer.global_step == 2 * 36 // 4
    lengths = [len(f["input_ids"]) for f in dm.train_dataset.features]
    for epoch, seen in enumerate(module.lengths):
        order = torch.randperm(36, generator=torch.Generator().manual_seed(dm.cfg.seed + epoch)).tolist()
        assert seen == [lengths[i] for i in order]
    assert module.lengths[0] != module.lengths[1] and len(set(lengths)) > 10
