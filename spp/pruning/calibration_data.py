"""Calibration windows: ``nsamples`` random windows of ``seqlen`` tokens from C4, WikiText-2, Alpaca or a file.

Document sampling follows Wanda/SparseGPT's C4 loader: with ``random.seed(seed)``, draw a random document until
its tokenization is longer than ``seqlen``, then a random window of exactly ``seqlen`` tokens inside it. Stream
sampling (WikiText-2, Alpaca, local files) joins all texts with blank lines, tokenizes once and draws random
windows from the stream.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from spp.paths import find_data
from spp.pruning.config import CALIBRATION_SOURCES, CalibrationConfig


def resolve_calibration_file(calibration: CalibrationConfig, data_dir: str | None = None) -> Path:
    """The data file ``calibration`` reads (``calibration.path``, the named source's file, or a path source).

    Raises:
        FileNotFoundError: naming every searched place and the config key to change.
    """
    rel = calibration.path or CALIBRATION_SOURCES.get(calibration.source, calibration.source)
    try:
        return find_data(rel, data_dir)
    except FileNotFoundError as err:
        known = ", ".join(CALIBRATION_SOURCES)
        raise FileNotFoundError(
            f"calibration data for calibration.source={calibration.source!r} not found ({err}). Use one of "
            f"{known}, a local .txt/.json/.jsonl path, or set calibration.path / data_dir."
        ) from err


def _record_text(record: Any, text_field: str, where: Path) -> str:
    if isinstance(record, str):
        return record
    if isinstance(record, dict):
        if "instruction" in record and "output" in record:
            parts = [record.get("instruction", ""), record.get("input", ""), record.get("output", "")]
            return "\n\n".join(p for p in parts if p)
        if text_field in record:
            return str(record[text_field])
    raise ValueError(f"record in {where} has no field {text_field!r}; set calibration.text_field to its text field")


def load_texts(path: Path, text_field: str = "text") -> list[str]:
    """Read texts from a ``.txt`` file (one document), a JSON array, or JSON lines (also under ``.json``)."""
    raw = path.read_text(encoding="utf-8")
    if path.suffix not in (".json", ".jsonl"):
        return [raw]
    records: list[Any]
    try:
        loaded = json.loads(raw)
        records = loaded if isinstance(loaded, list) else [loaded]
    except json.JSONDecodeError:
        records = [json.loads(line) for line in raw.splitlines() if line.strip()]
    return [_record_text(r, text_field, path) for r in records]


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, verbose=False)["input_ids"]


def sample_windows(
    texts: list[str], tokenizer: PreTrainedTokenizerBase, calibration: CalibrationConfig, where: str = "data"
) -> torch.Tensor:
    """Draw ``calibration.nsamples`` windows of ``calibration.seqlen`` tokens, shape (nsamples, seqlen).

    Raises:
        ValueError: no document (document sampling) or the whole stream (stream sampling) is longer than seqlen.
    """
    seqlen, nsamples = calibration.seqlen, calibration.nsamples
    sampling = calibration.sampling or ("document" if calibration.source == "c4" else "stream")
    rng = random.Random(calibration.seed)
    windows: list[list[int]] = []
    if sampling == "document":
        tokenized: dict[int, list[int]] = {}
        for _ in range(nsamples):
            while True:
                doc = rng.randint(0, len(texts) - 1)
                if doc not in tokenized:
                    tokenized[doc] = _ids(tokenizer, texts[doc])
                if len(tokenized[doc]) > seqlen:
                    break
                if len(tokenized) == len(texts) and all(len(t) <= seqlen for t in tokenized.values()):
                    longest = max(len(t) for t in tokenized.values())
                    raise ValueError(
                        f"no document in {where} is longer than calibration.seqlen={seqlen} tokens (longest: "
                        f"{longest}); lower calibration.seqlen or set calibration.sampling=stream"
                    )
            ids = tokenized[doc]
            start = rng.randint(0, len(ids) - seqlen - 1)
            windows.append(ids[start : start + seqlen])
    else:
        ids = _ids(tokenizer, "\n\n".join(texts))
        if len(ids) <= seqlen:
            raise ValueError(
                f"the text of {where} has only {len(ids)} tokens, not more than calibration.seqlen={seqlen}; "
                "lower calibration.seqlen or use a larger calibration source"
            )
        for _ in range(nsamples):
            start = rng.randint(0, len(ids) - seqlen - 1)
            windows.append(ids[start : start + seqlen])
    return torch.tensor(windows, dtype=torch.long)


def calibration_windows(
    tokenizer: PreTrainedTokenizerBase, calibration: CalibrationConfig, data_dir: str | None = None
) -> torch.Tensor:
    """Load the configured source and return (nsamples, seqlen) token ids."""
    path = resolve_calibration_file(calibration, data_dir)
    return sample_windows(load_texts(path, calibration.text_field), tokenizer, calibration, where=str(path))
