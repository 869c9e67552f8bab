"""Per-document records of lm-eval's multiple-choice tasks (``eval.log_samples=true``; the recovery study).

One JSON line per scored document, reduced from lm-eval's logged samples (nothing re-scored)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from spp.atomic import write_text_atomic
from spp.paths import read_json_records

DOC_RECORDS_FILE = "zero_shot_docs.jsonl"
"""Name of the per-document file written beside ``results.json`` / ``summary.json``."""

METRICS = ("acc", "acc_norm")


def _gold(sample: dict[str, Any]) -> int | None:
    """The correct choice's index: lm-eval's ``target`` when it is one (``label``, ``"{{... .index(answerKey)}}"``),
    else the document's ``gold`` field (tasks whose choices are the contexts, as WinoGrande's partial scoring)."""
    target = sample.get("target")
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    if isinstance(target, str) and target.strip().isdigit():
        return int(target.strip())
    gold = (sample.get("doc") or {}).get("gold")
    return int(gold) if isinstance(gold, (int, str)) and str(gold).strip().isdigit() else None


def _record(task: str, sample: dict[str, Any]) -> dict[str, Any]:
    """One document's record from one lm-eval sample (multiple choice: one ``(loglikelihood, is_greedy)`` per
    choice in ``filtered_resps``)."""
    resps = sample.get("filtered_resps") or []
    pairs = [r if isinstance(r, (list, tuple)) else (r, None) for r in resps]
    record = {"task": task, "doc_id": int(sample["doc_id"]), "doc_hash": sample.get("doc_hash"),
              "gold": _gold(sample), "loglikelihoods": [float(p[0]) for p in pairs],
              "greedy": [None if p[1] is None else bool(p[1]) for p in pairs]}
    record.update({m: float(sample[m]) for m in METRICS if isinstance(sample.get(m), (int, float))})
    return record


def doc_records(samples: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """lm-eval's ``results["samples"]`` (``{task: [sample, ...]}``) as per-document records, by task and doc id."""
    rows = [_record(task, s) for task, task_samples in samples.items() for s in task_samples
            if s.get("filter", "none") == "none"]
    return sorted(rows, key=lambda r: (r["task"], r["doc_id"]))


def majority_class(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per task: the accuracy of always answering the most frequent correct choice among the scored documents
    (``acc``), that choice (``label``) and the number of documents (``n``); tasks without ``gold`` are left out."""
    by_task: dict[str, Counter[int]] = {}
    for r in records:
        if r.get("gold") is not None:
            by_task.setdefault(r["task"], Counter())[int(r["gold"])] += 1
    out = {}
    for task, counts in sorted(by_task.items()):
        label, hits = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
        out[task] = {"acc": hits / sum(counts.values()), "label": float(label), "n": float(sum(counts.values()))}
    return out


def write_doc_records(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> Path:
    """Write ``records`` as JSON lines (atomically)."""
    return write_text_atomic(Path(path), "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def read_doc_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a file :func:`write_doc_records` wrote, or of the file of that name in a run directory."""
    path = Path(path)
    file = path / DOC_RECORDS_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist: evaluate with eval.log_samples=true to write it")
    return read_json_records(file, "evaluate again with eval.log_samples=true to rewrite it")
