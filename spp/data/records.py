"""Reading and validating Alpaca records from JSON / JSON-lines files, split-file directories or the hub."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spp.data.config import HUB_PREFIX
from spp.paths import find_data, read_json_records

log = logging.getLogger(__name__)

RECORD_SUFFIXES: tuple[str, ...] = (".json", ".jsonl")
MAX_LISTED_SKIPS = 20


@dataclass(frozen=True)
class AlpacaRecord:
    """One instruction-tuning example (``input`` is ``""`` when the record has none)."""

    instruction: str
    input: str
    output: str


@dataclass(frozen=True)
class SkippedRecord:
    """A malformed record that was left out: where it was and why."""

    source: str
    index: int
    reason: str


@dataclass
class RecordSet:
    """Valid records in source order, the skipped ones, and the files (or hub id) they came from."""

    records: list[AlpacaRecord]
    skipped: list[SkippedRecord] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)


def natural_key(path: Path) -> list[int | str]:
    """Sort key that orders the numbers inside a file name numerically (``x_9`` before ``x_10``)."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", path.name)]


def list_split_files(directory: Path) -> list[Path]:
    """The ``*.json``/``*.jsonl`` files of ``directory`` in natural order (``FileNotFoundError`` when none)."""
    files = [p for p in directory.iterdir() if p.is_file() and p.suffix in RECORD_SUFFIXES]
    if not files:
        raise FileNotFoundError(
            f"data directory {str(directory)!r} holds no {'/'.join(RECORD_SUFFIXES)} files; "
            "point data.source at a file or at a directory of split files"
        )
    return sorted(files, key=natural_key)


def validate_record(raw: Any) -> AlpacaRecord | str:
    """The record, or why it is malformed: ``instruction`` and ``output`` non-empty strings, ``input`` a string or
    missing / ``null`` (read as ``""``)."""
    if not isinstance(raw, dict):
        return f"expected an object, got {type(raw).__name__}"
    for key in ("instruction", "output"):
        if key not in raw or raw[key] is None:
            return f"missing {key!r}"
        if not isinstance(raw[key], str):
            return f"{key!r} is {type(raw[key]).__name__}, expected str"
        if not raw[key].strip():
            return f"empty {key!r}"
    value = "" if raw.get("input") is None else raw["input"]
    if not isinstance(value, str):
        return f"'input' is {type(value).__name__}, expected str"
    return AlpacaRecord(instruction=raw["instruction"], input=value, output=raw["output"])


def warn_skipped(skipped: Sequence[SkippedRecord]) -> None:
    """Log one warning that counts the skipped records and lists where they were (first 20)."""
    if not skipped:
        return
    listed = "; ".join(f"{Path(s.source).name}[{s.index}]: {s.reason}" for s in skipped[:MAX_LISTED_SKIPS])
    more = f" (and {len(skipped) - MAX_LISTED_SKIPS} more)" if len(skipped) > MAX_LISTED_SKIPS else ""
    log.warning("skipped %d malformed Alpaca record(s): %s%s", len(skipped), listed, more)


def _load_hub(dataset_id: str, split: str) -> list[Any]:
    import datasets

    try:
        dataset = datasets.load_dataset(dataset_id, split=split)
    except Exception as err:  # datasets raises many types (offline, missing split, missing repo)
        raise RuntimeError(
            f"could not load hub dataset {dataset_id!r} (split {split!r}): {err}. Offline machines need a local "
            "copy: use data=alpaca_sample / data=alpaca_cleaned or data.source=<file or directory>."
        ) from err
    return list(dataset)


def load_alpaca_records(
    source: str, data_dir: str | os.PathLike[str] | None = None, hub_split: str = "train"
) -> RecordSet:
    """Load and validate Alpaca records from a file, a directory of split files, or ``hub:<id>``.

    Malformed records are skipped and logged with file and index. A source found nowhere raises
    ``FileNotFoundError`` listing the places searched; invalid JSON or no valid record raises ``ValueError``."""
    if source.startswith(HUB_PREFIX):
        parts = [(source, _load_hub(source[len(HUB_PREFIX) :], hub_split))]
    else:
        path = find_data(source, data_dir)
        parts = [(str(f), read_json_records(f)) for f in (list_split_files(path) if path.is_dir() else [path])]
    records: list[AlpacaRecord] = []
    skipped: list[SkippedRecord] = []
    for name, raws in parts:
        for index, raw in enumerate(raws):
            result = validate_record(raw)
            if isinstance(result, AlpacaRecord):
                records.append(result)
            else:
                skipped.append(SkippedRecord(source=name, index=index, reason=result))
    warn_skipped(skipped)
    if not records:
        raise ValueError(
            f"data.source={source!r} holds no valid Alpaca record ({len(skipped)} malformed); each record needs "
            "string fields 'instruction' and 'output' (and optionally 'input')"
        )
    return RecordSet(records=records, skipped=skipped, sources=[name for name, _ in parts])
