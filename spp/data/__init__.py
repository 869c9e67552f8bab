"""Instruction-tuning data: the Alpaca prompt template, record loading/validation and the Lightning data module."""

from spp.data.alpaca import AlpacaDataModule, TokenizedDataset
from spp.data.collate import PadCollator
from spp.data.config import DataConfig, validation_split_size
from spp.data.prompts import PROMPT_NO_INPUT, PROMPT_WITH_INPUT, full_prompt, user_prompt
from spp.data.records import AlpacaRecord, RecordSet, SkippedRecord, load_alpaca_records, read_json_records
from spp.data.tokenization import IGNORE_INDEX, tokenize_records

__all__ = [
    "IGNORE_INDEX",
    "PROMPT_NO_INPUT",
    "PROMPT_WITH_INPUT",
    "AlpacaDataModule",
    "AlpacaRecord",
    "DataConfig",
    "PadCollator",
    "RecordSet",
    "SkippedRecord",
    "TokenizedDataset",
    "full_prompt",
    "load_alpaca_records",
    "read_json_records",
    "tokenize_records",
    "user_prompt",
    "validation_split_size",
]
