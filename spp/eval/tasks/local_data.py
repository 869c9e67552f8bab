"""lm-eval ``custom_dataset`` loaders that turn the local copies of the eval sets into lm-eval's row shapes.

With ``doc_seed`` every split but MMLU's ``dev`` is shuffled, so ``limit`` takes a seeded random sample."""

from __future__ import annotations

import csv
import functools
import random
import re
from pathlib import Path
from typing import Any

import datasets

from spp.eval.task_table import get_task
from spp.paths import find_data, read_json_records

RTE_LABELS = {"entailment": 0, "not_entailment": 1}
MMLU_ANSWERS = "ABCD"


def task_file(task: str, kwargs: dict[str, Any], index: int = 0) -> Path:
    """File ``index`` of ``task``'s ``data_files`` (:mod:`spp.eval.task_table`) under the data root of lm-eval's
    ``kwargs`` (``data_dir``, else ``$SPP_DATA_DIR``, ...); a plug-in task's loader reads its file with this too."""
    return find_data(get_task(task).data_files[index], kwargs.get("data_dir"))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return read_json_records(path, "point data_dir at a copy of the shipped task files")


def sample_order(rows: list[Any], doc_seed: int | None) -> list[Any]:
    """``rows`` in the seeded random order that ``eval.limit`` takes a prefix of (unchanged for ``None``)."""
    if doc_seed is None:
        return rows
    out = list(rows)
    random.Random(int(doc_seed)).shuffle(out)
    return out


def _split(name: str, rows: list[dict[str, Any]], kwargs: dict[str, Any]) -> datasets.DatasetDict:
    return datasets.DatasetDict({name: datasets.Dataset.from_list(sample_order(rows, kwargs.get("doc_seed")))})


BOOL_LABELS: dict[Any, int] = {False: 0, True: 1, "false": 0, "true": 1}  # 0 == False and 1 == True as keys


def _label(path: Path, row: int, value: Any, labels: dict[Any, int]) -> int:
    """``labels[value]`` (a string lower-cased), else one line naming the file, the row (counted from 1, as MMLU's)
    and the accepted labels."""
    key = value.lower() if isinstance(value, str) else value
    if key not in labels:
        accepted = ", ".join(k for k in labels if isinstance(k, str))
        raise ValueError(f"{path}: row {row + 1} has label {value!r}; use one of: {accepted}")
    return labels[key]


def boolq(**kwargs: Any) -> datasets.DatasetDict:
    """SuperGLUE BoolQ validation; ``label`` (``"false"``/``"true"`` strings or bools) -> 0 = no, 1 = yes."""
    path, rows = task_file("spp_boolq", kwargs), []
    for i, r in enumerate(_jsonl(path)):
        label = _label(path, i, r["label"], BOOL_LABELS)
        rows.append({"question": r["question"], "passage": r["passage"], "label": label, "idx": i})
    return _split("validation", rows, kwargs)


def rte(**kwargs: Any) -> datasets.DatasetDict:
    """RTE validation in GLUE's shape (``sentence1``, ``sentence2``, label 0 = entailment); the same 277 pairs as
    SuperGLUE's."""
    path, rows = task_file("spp_rte", kwargs), []
    for i, r in enumerate(_jsonl(path)):
        label = r["label"]
        rows.append(
            {
                "sentence1": r["premise"],
                "sentence2": r["hypothesis"],
                "label": _label(path, i, label, RTE_LABELS) if isinstance(label, str) else int(label),
                "idx": r.get("idx", i),
            }
        )
    return _split("validation", rows, kwargs)


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's HellaSwag text cleanup (drop WikiHow ``[...]`` tags, ``[title]`` -> ``". "``)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def capitalize_last_fragment(query: str) -> str:
    """Approximate lm-eval's ``ctx_a + " " + ctx_b.capitalize()`` on klosax's already joined context by upper-casing
    the fragment after the last sentence end (the rest of ``ctx_b`` is not lower-cased: its extent is unknown)."""
    cut = max(query.rfind(". "), query.rfind(": "))
    if cut < 0:
        return query
    head, tail = query[: cut + 2], query[cut + 2 :]
    return head + tail[:1].upper() + tail[1:] if tail[:1].islower() else query


def hellaswag(**kwargs: Any) -> datasets.DatasetDict:
    """HellaSwag validation from klosax's text form (6 lines per task: context, gold, 4 endings)."""
    lines = task_file("spp_hellaswag", kwargs).read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise ValueError(f"HellaSwag text file has {len(lines)} lines, not a multiple of 6 (context, gold, 4 endings)")
    rows = []
    for i in range(0, len(lines), 6):
        ctx, gold, endings = lines[i], int(lines[i + 1]), lines[i + 2 : i + 6]
        rows.append(
            {
                "query": hellaswag_preprocess(capitalize_last_fragment(ctx)),
                "choices": [hellaswag_preprocess(e) for e in endings],
                "label": gold,
            }
        )
    return _split("validation", rows, kwargs)


def winogrande(**kwargs: Any) -> datasets.DatasetDict:
    """WinoGrande (xl) validation in llm-foundry's form (``context_options``, ``continuation``, ``gold``): the same
    decomposition lm-eval's ``winogrande`` builds."""
    rows = [
        {
            "context_options": list(r["context_options"]),
            "continuation": r["continuation"].strip(),
            "gold": int(r["gold"]),
        }
        for r in _jsonl(task_file("spp_winogrande", kwargs))
    ]
    return _split("validation", rows, kwargs)


def _arc(task: str, **kwargs: Any) -> datasets.DatasetDict:
    """ARC test (``task``: ``spp_arc_easy`` or ``spp_arc_challenge``) in HF ``ai2_arc`` shape (``question``,
    ``choices.text/label``, ``answerKey``)."""
    rows = []
    for r in _jsonl(task_file(task, kwargs)):
        choices = r["question"]["choices"]
        rows.append(
            {
                "id": r["id"],
                "question": r["question"]["stem"],
                "choices": {"text": [c["text"] for c in choices], "label": [c["label"] for c in choices]},
                "answerKey": r["answerKey"],
            }
        )
    return _split("test", rows, kwargs)


arc_easy = functools.partial(_arc, "spp_arc_easy")
arc_challenge = functools.partial(_arc, "spp_arc_challenge")


_OBQA_CHOICE = re.compile(r"\(([A-D])\) ")


def parse_obqa_choices(field: str) -> tuple[list[str], list[str]]:
    """Split ``"(A) x (B) y (C) z (D) w"`` into ``(["A".."D"], ["x".."w"])`` (``ValueError`` when markers are
    missing)."""
    parts = _OBQA_CHOICE.split(field)
    labels, texts = parts[1::2], [t.strip() for t in parts[2::2]]
    if labels != list("ABCD") or parts[0].strip():
        raise ValueError(f"OpenBookQA choices field not in '(A) .. (B) .. (C) .. (D) ..' form: {field!r}")
    return labels, texts


def openbookqa(**kwargs: Any) -> datasets.DatasetDict:
    """OpenBookQA main test from the official ``test.tsv`` in HF ``openbookqa/main`` shape."""
    rows = []
    with task_file("spp_openbookqa", kwargs).open(encoding="utf-8", newline="") as fh:
        for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE):
            labels, texts = parse_obqa_choices(r["Choices"])
            rows.append(
                {
                    "id": r["ID"],
                    "question_stem": r["Question Stem"],
                    "choices": {"text": texts, "label": labels},
                    "answerKey": r["Answer Key"].strip(),
                }
            )
    return _split("test", rows, kwargs)


def _mmlu_rows(path: Path, subject: str) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8", newline="") as fh:
        records = list(csv.reader(fh))
    rows = []
    for n, rec in enumerate(records, start=1):
        if len(rec) != 6 or rec[5] not in MMLU_ANSWERS:
            raise ValueError(f"{path}: row {n} is not 'question,A,B,C,D,answer letter'")
        rows.append({"question": rec[0], "subject": subject, "choices": rec[1:5], "answer": MMLU_ANSWERS.index(rec[5])})
    return rows


def mmlu(subject: str = "", **kwargs: Any) -> datasets.DatasetDict:
    """One MMLU ``subject`` (from ``dataset_kwargs``) in ``cais/mmlu`` shape; test + dev."""
    if not subject:
        raise ValueError("MMLU task needs dataset_kwargs.subject (e.g. 'anatomy')")
    splits = _split("test", _mmlu_rows(task_file(f"spp_mmlu_{subject}", kwargs, 0), subject), kwargs)
    splits["dev"] = datasets.Dataset.from_list(_mmlu_rows(task_file(f"spp_mmlu_{subject}", kwargs, 1), subject))
    return splits
