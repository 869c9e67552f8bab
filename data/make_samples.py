"""Re-draw the truncated eval samples of data/ as seeded random subsets of the full-size copies.

The one-epoch methods study reads these samples.

Every sampled file keeps whole records byte-for-byte and in their original order; only which records are kept
changes (``random.Random(f"{SEED}/<relative path>").sample`` of the record indices, sorted). Use:

    python data/make_samples.py --full ../shared/data --out data
"""

from __future__ import annotations

import argparse
import csv
import random
import re
from pathlib import Path

SEED = 16
"""Seed of the record sample (one ``random.Random(f"{SEED}/<relative path>")`` stream per file)."""

SAMPLES: dict[str, tuple[str, int]] = {
    "boolq/val.jsonl": ("jsonl", 200),
    "winogrande/winogrande.jsonl": ("jsonl", 200),
    "arc/ARC-Easy-Test.jsonl": ("jsonl", 200),
    "arc/ARC-Challenge-Test.jsonl": ("jsonl", 200),
    "hellaswag/hellaswag_val_full.txt": ("hellaswag", 200),
}
MMLU_PER_SUBJECT = 10


def jsonl_records(text: str) -> list[str]:
    """One record per non-empty line (newline kept)."""
    return [line for line in re.split(r"(?<=\n)", text) if line.strip()]


def hellaswag_records(text: str) -> list[str]:
    """Six lines per task (context, gold, four endings), newlines kept."""
    lines = [line for line in re.split(r"(?<=\n)", text) if line]
    if len(lines) % 6:
        raise ValueError("HellaSwag text is not a multiple of 6 lines")
    return ["".join(lines[i : i + 6]) for i in range(0, len(lines), 6)]


def csv_records(text: str) -> list[str]:
    """Whole CSV records as ``csv.reader`` splits them (a quoted field may span lines), source text kept."""
    lines = [line for line in re.split(r"(?<=\n)", text) if line]  # "\n" only: fields may hold "\r" or U+2028
    reader = csv.reader(iter(lines))
    out, done = [], 0
    for _ in reader:
        out.append("".join(lines[done : reader.line_num]))
        done = reader.line_num
    return out


def sample(records: list[str], k: int, name: str) -> tuple[list[str], list[int]]:
    """``k`` records drawn with ``random.Random(f"{SEED}/{name}")`` (one stream per file), in file order; their
    0-based indices."""
    idx = sorted(random.Random(f"{SEED}/{name}").sample(range(len(records)), min(k, len(records))))
    return [records[i] for i in idx], idx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", type=Path, required=True, help="full-size data root (../shared/data)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = ap.parse_args()
    readers = {"jsonl": jsonl_records, "hellaswag": hellaswag_records}
    for rel, (kind, k) in SAMPLES.items():
        records = readers[kind]((args.full / rel).read_bytes().decode("utf-8"))  # bytes: no newline translation
        picked, idx = sample(records, k, rel)
        text = "".join(picked)
        (args.out / rel).write_bytes(text.encode("utf-8"))
        print(f"{rel}: {len(picked)} of {len(records)} (first indices {idx[:5]})")
    for path in sorted((args.full / "mmlu/test").glob("*_test.csv")):
        records = csv_records(path.read_bytes().decode("utf-8"))
        picked, _ = sample(records, MMLU_PER_SUBJECT, f"mmlu/test/{path.name}")
        (args.out / "mmlu/test" / path.name).write_bytes("".join(picked).encode("utf-8"))
    print(f"mmlu/test: {MMLU_PER_SUBJECT} per subject")


if __name__ == "__main__":
    main()
