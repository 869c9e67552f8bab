"""Paired comparison of two models' zero-shot accuracies, document by document (the recovery study).

Per task ``diff = mean(x_a,i - x_b,i)``, ``se = sd(d) / sqrt(n)``; the T-task mean has ``se = sqrt(sum se_t^2) / T``.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from spp.eval.doc_records import read_doc_records

LEVEL = 0.95
POWER = 0.80
MEAN_ROW = "mean of tasks"
_Z, _Z_POWER = NormalDist().inv_cdf(0.5 + LEVEL / 2.0), NormalDist().inv_cdf(POWER)  # z_(1-α/2) and z_power


@dataclass(frozen=True)
class PairedAccuracy:
    """One task's paired comparison (accuracies as fractions; ``diff = acc_a - acc_b``; ``n`` documents scored by
    both; ``mdd`` at ``POWER``, two-sided, level ``1 - LEVEL``; ``a_only``: documents only ``a`` got right)."""

    task: str
    n: int
    acc_a: float
    acc_b: float
    diff: float
    se: float
    low: float
    high: float
    mdd: float
    a_only: int
    b_only: int


def _paired_values(a: list[dict[str, Any]], b: list[dict[str, Any]], metric: str) -> dict[str, list[tuple[float,
                                                                                                    float]]]:
    """``{task: [(x_a, x_b), ...]}`` over the documents both files scored (same task, doc id and doc hash).

    A same task and id with another hash (not the same documents) or no document in common raises ``ValueError``."""
    index = {(r["task"], r["doc_id"]): r for r in b}
    out: dict[str, list[tuple[float, float]]] = {}
    for ra in a:
        rb = index.get((ra["task"], ra["doc_id"]))
        if rb is None:
            continue
        if ra.get("doc_hash") != rb.get("doc_hash"):
            raise ValueError(f"{ra['task']} document {ra['doc_id']} differs between the two files (doc_hash): "
                             "compare runs with the same eval.limit, eval.doc_seed and data files")
        if metric not in ra or metric not in rb:
            continue
        out.setdefault(ra["task"], []).append((float(ra[metric]), float(rb[metric])))
    if not out:
        raise ValueError(f"the two files have no document scored with {metric!r} in common")
    return out


def _row(task: str, n: int, acc_a: float, acc_b: float, diff: float, se: float, a_only: int,
         b_only: int) -> PairedAccuracy:
    """A row with the interval ``diff ± z_(1-α/2) se`` and the MDD ``(z_(1-α/2) + z_power) se``."""
    return PairedAccuracy(task, n, acc_a, acc_b, diff, se, diff - _Z * se, diff + _Z * se, (_Z + _Z_POWER) * se,
                          a_only, b_only)


def _task_row(task: str, pairs: list[tuple[float, float]]) -> PairedAccuracy:
    """The paired statistics of one task's ``(x_a, x_b)`` pairs."""
    n = len(pairs)
    d = [xa - xb for xa, xb in pairs]
    diff = sum(d) / n
    var = sum((v - diff) ** 2 for v in d) / (n - 1) if n > 1 else math.nan
    return _row(task, n, sum(p[0] for p in pairs) / n, sum(p[1] for p in pairs) / n, diff, math.sqrt(var / n),
                sum(1 for v in d if v > 0), sum(1 for v in d if v < 0))


def paired_accuracy(a: list[dict[str, Any]], b: list[dict[str, Any]], metric: str = "acc") -> list[PairedAccuracy]:
    """One :class:`PairedAccuracy` per task both files scored, then their unweighted mean (:data:`MEAN_ROW`)."""
    rows = [_task_row(task, pairs) for task, pairs in sorted(_paired_values(a, b, metric).items())]
    t = len(rows)
    rows.append(_row(MEAN_ROW, sum(r.n for r in rows), sum(r.acc_a for r in rows) / t, sum(r.acc_b for r in rows) / t,
                     sum(r.diff for r in rows) / t, math.sqrt(sum(r.se ** 2 for r in rows)) / t,
                     sum(r.a_only for r in rows), sum(r.b_only for r in rows)))
    return rows


def paired_table(rows: list[PairedAccuracy], metric: str = "acc") -> str:
    """Markdown: per task ``n``, both accuracies, ``A - B`` with its interval, the MDD, discordant documents (%)."""
    lines = [f"| task | n | A {metric} | B {metric} | A − B [{LEVEL:.0%} paired] | MDD ({POWER:.0%} power) | "
             "A only / B only |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.task} | {r.n} | {100 * r.acc_a:.2f} | {100 * r.acc_b:.2f} | {100 * r.diff:+.2f} "
                     f"[{100 * r.low:+.2f}, {100 * r.high:+.2f}] | {100 * r.mdd:.2f} | {r.a_only} / {r.b_only} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="model A: its zero_shot_docs.jsonl, or the run/output directory holding it")
    parser.add_argument("b", help="model B, the same")
    parser.add_argument("--metric", default="acc", choices=("acc", "acc_norm"))
    args = parser.parse_args(argv)
    try:
        rows = paired_accuracy(read_doc_records(args.a), read_doc_records(args.b), args.metric)
    except (FileNotFoundError, ValueError) as err:
        print(f"paired: {err}", file=sys.stderr)
        return 2
    print(paired_table(rows, args.metric), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
