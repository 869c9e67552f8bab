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


def _row(task: str, pairs: list[tuple[float, float]], z: float, z_power: float) -> PairedAccuracy:
    """The paired statistics of one task's ``(x_a, x_b)`` pairs."""
    n = len(pairs)
    d = [xa - xb for xa, xb in pairs]
    diff = sum(d) / n
    var = sum((v - diff) ** 2 for v in d) / (n - 1) if n > 1 else math.nan
    se = math.sqrt(var / n)
    return PairedAccuracy(task=task, n=n, acc_a=sum(p[0] for p in pairs) / n, acc_b=sum(p[1] for p in pairs) / n,
                          diff=diff, se=se, low=diff - z * se, high=diff + z * se, mdd=(z + z_power) * se,
                          a_only=sum(1 for v in d if v > 0), b_only=sum(1 for v in d if v < 0))


def paired_accuracy(a: list[dict[str, Any]], b: list[dict[str, Any]], metric: str = "acc", level: float = LEVEL,
                    power: float = POWER) -> list[PairedAccuracy]:
    """One :class:`PairedAccuracy` per task both files scored, then their unweighted mean (:data:`MEAN_ROW`)."""
    if not (0 < level < 1 and 0 < power < 1):
        raise ValueError(f"level={level} and power={power} must be in (0, 1)")
    z, z_power = NormalDist().inv_cdf(0.5 + level / 2.0), NormalDist().inv_cdf(power)  # z_(1-α/2) and z_power
    rows = [_row(task, pairs, z, z_power) for task, pairs in sorted(_paired_values(a, b, metric).items())]
    t = len(rows)
    diff = sum(r.diff for r in rows) / t
    se = math.sqrt(sum(r.se ** 2 for r in rows)) / t
    rows.append(PairedAccuracy(task=MEAN_ROW, n=sum(r.n for r in rows), acc_a=sum(r.acc_a for r in rows) / t,
                               acc_b=sum(r.acc_b for r in rows) / t, diff=diff, se=se, low=diff - z * se,
                               high=diff + z * se, mdd=(z + z_power) * se, a_only=sum(r.a_only for r in rows),
                               b_only=sum(r.b_only for r in rows)))
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
