"""Calibration windows: ``nsamples`` random windows of ``seqlen`` tokens from C4, WikiText-2, Alpaca or a file.
Document sampling follows Wanda/SparseGPT's C4 loader; :func:`check_supply` refuses a source that is too short."""

from __future__ import annotations

import gzip
import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from spp.errors import UserError
from spp.models.loading import load_tokenizer
from spp.paths import find_data
from spp.pruning.config import CALIBRATION_SOURCES, CalibrationConfig

log = logging.getLogger(__name__)


def resolve_calibration_file(calibration: CalibrationConfig, data_dir: str | None = None) -> Path:
    """The data file ``calibration`` reads; ``FileNotFoundError`` names every searched place and the key to change."""
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
    """Read texts from a ``.txt`` file (one document), a JSON array, or JSON lines (also under ``.json``); a
    ``.gz`` suffix is read through gzip (C4's own ``c4-train.00000-of-01024.json.gz``)."""
    suffixes = path.suffixes[-2:] if path.suffix == ".gz" else [path.suffix]
    raw = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text("utf-8")
    if suffixes[0] not in (".json", ".jsonl"):
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


def sampling_of(calibration: CalibrationConfig) -> str:
    """``document`` or ``stream``: ``calibration.sampling``, else document for c4 and stream otherwise."""
    return calibration.sampling or ("document" if calibration.source == "c4" else "stream")


@dataclass
class Supply:
    """The tokenized part of a calibration source that :func:`check_supply` read (reused by the sampler)."""

    documents: dict[int, list[int]] = field(default_factory=dict)
    stream: list[int] | None = None


def _longer_documents(texts: list[str], tokenizer: PreTrainedTokenizerBase, seqlen: int, wanted: int,
                      supply: Supply, chunk: int = 256) -> int:
    """Tokenize documents in file order until ``wanted`` of them are longer than ``seqlen`` tokens; their count."""
    found = 0
    for first in range(0, len(texts), chunk):
        if found >= wanted:
            break
        for i, ids in enumerate(tokenizer(texts[first:first + chunk], verbose=False)["input_ids"], start=first):
            supply.documents[i] = ids
            found += len(ids) > seqlen
    return found


def check_supply(texts: list[str], tokenizer: PreTrainedTokenizerBase, calibration: CalibrationConfig,
                 where: str) -> Supply:
    """Refuse (:class:`UserError`) a source that cannot supply ``nsamples`` windows of ``seqlen`` tokens (fewer
    documents longer than ``seqlen``, or a stream under ``nsamples * seqlen`` tokens); returns what it tokenized."""
    seqlen, nsamples = calibration.seqlen, calibration.nsamples
    supply = Supply()
    larger = "point calibration.path at a larger file (the paper: C4's en/c4-train.00000-of-01024.json.gz, see " \
             "docs/pruning.md#calibration)"
    if sampling_of(calibration) == "stream":
        supply.stream = _ids(tokenizer, "\n\n".join(texts))
        tokens = len(supply.stream)
        if tokens <= seqlen:
            raise UserError(f"the text of {where} has only {tokens} tokens, not more than calibration.seqlen={seqlen} "
                            "(one calibration window)", f"lower calibration.seqlen below {tokens} or {larger}",
                            key="calibration.seqlen", path=where)
        if tokens < nsamples * seqlen:
            raise UserError(f"calibration.nsamples={nsamples} windows of calibration.seqlen={seqlen} tokens ask for "
                            f"{nsamples * seqlen} tokens; the text of {where} has {tokens}",
                            f"lower calibration.nsamples to <= {tokens // seqlen} (or calibration.seqlen) or {larger}",
                            key="calibration.nsamples", path=where)
        return supply
    found = _longer_documents(texts, tokenizer, seqlen, nsamples, supply)
    if found < nsamples:
        lengths = sorted((len(ids) for ids in supply.documents.values()), reverse=True)
        if found == 0:
            raise UserError(f"no document in {where} is longer than calibration.seqlen={seqlen} tokens (one "
                            f"calibration window; the longest has {lengths[0] if lengths else 0})",
                            f"lower calibration.seqlen, set calibration.sampling=stream or {larger}",
                            key="calibration.seqlen", path=where)
        shorter = f" or calibration.seqlen to <= {lengths[nsamples - 1] - 1}" if len(lengths) >= nsamples else ""
        raise UserError(f"calibration.nsamples={nsamples} windows of calibration.seqlen={seqlen} tokens need "
                        f"{nsamples} documents longer than {seqlen} tokens; {where} holds {found} of {len(texts)}",
                        f"lower calibration.nsamples to <= {found}{shorter}, or {larger}",
                        key="calibration.nsamples", path=where)
    return supply


def check_calibration_source(calibration: CalibrationConfig, data_dir: str | None, model: Any = None) -> None:
    """The preflight's check (before the model loads): the calibration file exists, reads, and, given the
    ``model`` config (its tokenizer is loaded, no weight), can supply the windows asked (:func:`check_supply`)."""
    try:
        path = resolve_calibration_file(calibration, data_dir)
    except FileNotFoundError as err:
        raise UserError(f"calibration.source={calibration.source!r}: {str(err).split('; searched')[0]}",
                        "pass data_dir=<dir holding it> or calibration.path=<file>", key="calibration.source") from err
    if model is None:
        return
    try:
        texts = load_texts(path, calibration.text_field)
    except (ValueError, OSError) as err:
        raise UserError(f"calibration file {path}: {err}", "fix the file or point calibration.path at a good one",
                        key="calibration.path", path=path) from err
    try:
        tokenizer = load_tokenizer(model)
    except FileNotFoundError:
        return  # the model's own checks name its files; the supply is checked when the windows are drawn
    check_supply(texts, tokenizer, calibration, str(path))


@dataclass
class CalibrationDraw:
    """The windows a draw made, ``(nsamples, seqlen)``, and where they come from (the prune result's
    ``report.overall["calibration"]``); the document counts are ``None`` for a stream and vice versa."""

    windows: torch.Tensor
    file: str
    sampling: str
    texts: int
    distinct_documents: int | None = None
    stream_tokens: int | None = None
    covered_tokens: int | None = None

    def record(self) -> dict[str, Any]:
        """The draw as JSON fields (no token ids)."""
        nsamples, seqlen = self.windows.shape
        return {"file": self.file, "sampling": self.sampling, "nsamples": int(nsamples), "seqlen": int(seqlen),
                "texts_in_file": self.texts, "distinct_documents": self.distinct_documents,
                "stream_tokens": self.stream_tokens, "covered_tokens": self.covered_tokens}

    def describe(self) -> str:
        """One log line: how many windows, from how many documents or how much of the stream."""
        nsamples, seqlen = self.windows.shape
        head = f"calibration: {nsamples} windows of {seqlen} tokens"
        if self.sampling == "document":
            return f"{head} from {self.distinct_documents} distinct documents of {self.texts} in {self.file}"
        share = 100.0 * (self.covered_tokens or 0) / max(self.stream_tokens or 1, 1)
        return f"{head} from a {self.stream_tokens}-token stream of {self.texts} texts in {self.file} " \
               f"({share:.1f} % of it inside a window)"


def sample_windows(
    texts: list[str], tokenizer: PreTrainedTokenizerBase, calibration: CalibrationConfig, where: str = "data",
) -> CalibrationDraw:
    """Draw ``calibration.nsamples`` windows of ``calibration.seqlen`` tokens (after :func:`check_supply`)."""
    seqlen, nsamples = calibration.seqlen, calibration.nsamples
    supply = check_supply(texts, tokenizer, calibration, where)
    rng = random.Random(calibration.seed)
    windows: list[list[int]] = []
    if sampling_of(calibration) == "document":
        drawn: set[int] = set()
        for _ in range(nsamples):
            while True:  # check_supply found a document longer than seqlen: this ends
                doc = rng.randint(0, len(texts) - 1)
                if doc not in supply.documents:
                    supply.documents[doc] = _ids(tokenizer, texts[doc])
                if len(supply.documents[doc]) > seqlen:
                    break
            ids = supply.documents[doc]
            start = rng.randint(0, len(ids) - seqlen - 1)
            windows.append(ids[start : start + seqlen])
            drawn.add(doc)
        return CalibrationDraw(torch.tensor(windows, dtype=torch.long), where, "document", len(texts), len(drawn))
    ids = supply.stream or []
    covered = torch.zeros(len(ids), dtype=torch.bool)
    for _ in range(nsamples):
        start = rng.randint(0, len(ids) - seqlen - 1)
        windows.append(ids[start : start + seqlen])
        covered[start : start + seqlen] = True
    return CalibrationDraw(torch.tensor(windows, dtype=torch.long), where, "stream", len(texts),
                           stream_tokens=len(ids), covered_tokens=int(covered.sum()))


def draw_calibration(
    tokenizer: PreTrainedTokenizerBase, calibration: CalibrationConfig, data_dir: str | None = None,
    announce: bool = True,
) -> CalibrationDraw:
    """Load the configured source and draw its windows; ``announce`` logs :meth:`CalibrationDraw.describe`."""
    path = resolve_calibration_file(calibration, data_dir)
    draw = sample_windows(load_texts(path, calibration.text_field), tokenizer, calibration, where=str(path))
    if announce:
        log.info(draw.describe())
    return draw
