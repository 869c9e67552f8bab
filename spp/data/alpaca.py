"""``AlpacaDataModule``: Alpaca instruction-tuning data for Lightning (load, validate, split, tokenise, batch)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import PreTrainedTokenizerBase

from spp.data.collate import PadCollator
from spp.data.config import DataConfig, validation_split_size
from spp.data.records import AlpacaRecord, RecordSet, load_alpaca_records
from spp.data.resumable import ResumableLoader, trainer_position
from spp.data.tokenization import IGNORE_INDEX, Feature, carries_loss, tokenize_records
from spp.errors import UserError

log = logging.getLogger(__name__)


class TokenizedDataset(Dataset):
    """A list of tokenised features (``input_ids``, ``attention_mask``, ``labels`` lists)."""

    def __init__(self, features: list[Feature]) -> None:
        self.features = features

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int) -> Feature:
        return self.features[index]

    @property
    def num_tokens(self) -> int:
        """Total (unpadded) tokens."""
        return sum(len(f["input_ids"]) for f in self.features)

    @property
    def num_label_tokens(self) -> int:
        """Tokens that carry loss (labels other than -100)."""
        return sum(sum(1 for t in f["labels"] if t != IGNORE_INDEX) for f in self.features)


def _with_overrides(cfg: DataConfig | None, overrides: Mapping[str, Any]) -> DataConfig:
    """``cfg`` (default ``DataConfig()``) with some fields replaced; unknown fields fail naming the key."""
    known = {f.name for f in dataclasses.fields(DataConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown data config key(s) {unknown}; valid keys: {sorted(known)}")
    return dataclasses.replace(cfg or DataConfig(), **overrides)


class AlpacaDataModule(L.LightningDataModule):
    """Alpaca instruction-tuning data: records → template → tokens → train/validation loaders.

    Relative ``data.source`` paths are searched under ``data_dir`` first; ``overrides`` replace ``cfg`` fields
    (``max_examples=64``). The pad id falls back to EOS when the tokenizer has none."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        cfg: DataConfig | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        **overrides: Any,
    ) -> None:
        super().__init__()
        self.cfg = _with_overrides(cfg, overrides)
        self.tokenizer = tokenizer
        self.data_dir = data_dir
        self.progress = progress
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a pad nor an EOS token to pad with")
        self.collator = PadCollator(int(pad_id), self.cfg.pad_to_multiple_of, self.cfg.padding_side)
        self.record_set: RecordSet | None = None
        self.train_dataset: TokenizedDataset | None = None
        self.val_dataset: TokenizedDataset | None = None
        self.train_records: list[AlpacaRecord] = []
        self.val_records: list[AlpacaRecord] = []
        self._resume: dict[str, int] = {}  # loader position restored from a checkpoint (see spp.data.resumable)
        self.dropped_no_loss: dict[str, int] = {"train": 0, "val": 0}  # records without a loss-carrying token

    def setup(self, stage: str | None = None) -> None:
        """Load, validate, cap (``max_examples``), split (seeded) and tokenise the records, once."""
        if self.train_dataset is not None:
            return
        cfg = self.cfg
        record_set = load_alpaca_records(cfg.source, self.data_dir, cfg.hub_split)
        records = record_set.records
        if cfg.max_examples is not None:
            records = records[: cfg.max_examples]
        n_val = validation_split_size(len(records), cfg.val_size, cfg.max_val_fraction)
        order = torch.randperm(len(records), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        train_records, train_features = self._tokenize([records[i] for i in sorted(order[n_val:])], "train")
        val_records, val_features = self._tokenize([records[i] for i in sorted(order[:n_val])], "val")
        self._check_dropped(len(train_records))
        self.train_dataset, self.val_dataset = TokenizedDataset(train_features), TokenizedDataset(val_features)
        self.record_set = record_set
        self.train_records, self.val_records = train_records, val_records
        log.info(
            "Alpaca data %s: %d valid records (%d skipped) from %d source(s); %d train / %d validation, "
            "%d train tokens",
            cfg.name,
            len(record_set.records),
            len(record_set.skipped),
            len(record_set.sources),
            len(self.train_dataset),
            len(self.val_dataset),
            self.train_dataset.num_tokens,
        )

    def _tokenize(self, records: list[AlpacaRecord], split: str) -> tuple[list[AlpacaRecord], list[Feature]]:
        """Tokenise ``records`` and drop those without a loss-carrying token (counted in ``dropped_no_loss``).

        With ``train_on_inputs=false`` a prompt that fills ``max_length`` has no response token; a batch of them has a
        ``nan`` loss."""
        cfg = self.cfg
        features = tokenize_records(records, self.tokenizer, max_length=cfg.max_length, add_eos=cfg.add_eos,
                                    train_on_inputs=cfg.train_on_inputs, progress=self.progress)
        keep = [i for i, feature in enumerate(features) if carries_loss(feature["labels"])]
        self.dropped_no_loss[split] = len(features) - len(keep)
        return [records[i] for i in keep], [features[i] for i in keep]

    def _check_dropped(self, n_train: int) -> None:
        """Log the records dropped for want of a loss-carrying token; refuse when no training record is left."""
        dropped, cfg = self.dropped_no_loss, self.cfg
        if not any(dropped.values()):
            return
        log.warning("dropped %d training and %d validation record(s) whose prompt fills data.max_length=%d: with "
                    "data.train_on_inputs=false no response token is left to carry the loss; raise data.max_length "
                    "to keep them", dropped["train"], dropped["val"], cfg.max_length)
        if n_train == 0:
            raise UserError(f"every training record was dropped ({dropped['train']}): each prompt fills "
                            f"data.max_length={cfg.max_length}, so with data.train_on_inputs=false no response token "
                            "is left to learn from", "raise data.max_length, or set data.train_on_inputs=true",
                            key="data.max_length")

    def _require_setup(self) -> tuple[TokenizedDataset, TokenizedDataset]:
        if self.train_dataset is None or self.val_dataset is None:
            raise RuntimeError("AlpacaDataModule.setup() must run before its datasets or loaders are used")
        return self.train_dataset, self.val_dataset

    def _loader(self, dataset: TokenizedDataset, batch_size: int, **kwargs: Any) -> DataLoader:
        """A loader of ``dataset`` batched by the collator (``num_workers`` kept alive between epochs)."""
        return DataLoader(dataset, batch_size=batch_size, collate_fn=self.collator, num_workers=self.cfg.num_workers,
                          persistent_workers=self.cfg.num_workers > 0, **kwargs)

    def train_dataloader(self) -> DataLoader | ResumableLoader:
        """Shuffled training batches; the order depends only on ``(data.seed, epoch)``, so resumes repeat it.

        A ``DistributedSampler`` is used even on one process: Lightning calls its ``set_epoch`` and adds none of its own
        under DDP. Under a trainer the loader skips the batches a resumed checkpoint already trained on."""
        train, _ = self._require_setup()
        trainer = self.trainer
        world_size, rank = (1, 0) if trainer is None else (int(trainer.world_size), int(trainer.global_rank))
        sampler = DistributedSampler(
            train, num_replicas=world_size, rank=rank, shuffle=self.cfg.shuffle, seed=self.cfg.seed
        )
        loader = self._loader(train, self.cfg.train_batch_size, sampler=sampler)
        return loader if trainer is None else ResumableLoader(loader, lambda: trainer_position(trainer), self._resume)

    def state_dict(self) -> dict[str, int]:
        """Where training stands in the current epoch (Lightning stores it in every checkpoint)."""
        if self.trainer is None:
            return {}
        epoch, done = trainer_position(self.trainer)
        return {"epoch": epoch, "batches_done": done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Remember where the checkpoint stopped; the next iteration of that epoch skips those batches."""
        self._resume.clear()
        self._resume.update({k: int(v) for k, v in state.items()})

    def val_dataloader(self) -> DataLoader | list:
        """Validation batches in a fixed order (an empty list when the validation split is empty)."""
        _, val = self._require_setup()
        return self._loader(val, self.cfg.eval_batch_size, shuffle=False) if len(val) else []

    def summary(self) -> dict[str, Any]:
        """Counts for logs and ``summary.json``: sources, valid/skipped records, split sizes, tokens, and the
        records dropped for want of a loss-carrying token (``dropped_no_loss_records``, per split)."""
        train, val = self._require_setup()
        assert self.record_set is not None
        return {
            "name": self.cfg.name,
            "sources": list(self.record_set.sources),
            "valid_records": len(self.record_set.records),
            "skipped_records": len(self.record_set.skipped),
            "skipped_indices": [[s.source, s.index] for s in self.record_set.skipped],
            "train_examples": len(train),
            "val_examples": len(val),
            "train_tokens": train.num_tokens,
            "train_label_tokens": train.num_label_tokens,
            "val_tokens": val.num_tokens,
            "max_length": self.cfg.max_length,
            "train_on_inputs": self.cfg.train_on_inputs,
            "dropped_no_loss_records": dict(self.dropped_no_loss),
        }
