"""One row per run, keyed by the swept keys: the numbers ``summary.json`` holds, as Markdown, CSV or plain rows."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any

from spp.compare.runs import SweptRun
from spp.report_text import interval_text, markdown_lines

PPL_STAGES: tuple[str, ...] = ("merged", "reconstructed", "pruned", "dense")
"""Which perplexity is a run's ``ppl``: the first its summary holds (a pruned-only run has no merged model)."""


@dataclass(frozen=True)
class Metric:
    """A column a table row holds and a figure can draw: ``name`` with ``<name>_low``/``<name>_high`` when it has an
    interval."""

    name: str
    label: str
    """What it is, for ``--help``."""
    axis: str
    """The figure's axis label."""
    interval: bool = False


COMPARED_METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("ppl", "perplexity after training (the merged model; the pruned one when nothing was trained)",
           "perplexity", interval=True),
    Metric("ppl_pruned", "perplexity of the pruned model", "pruned perplexity", interval=True),
    Metric("ppl_dense", "perplexity of the dense model", "dense perplexity", interval=True),
    Metric("sparsity_after", "sparsity measured after the merge", "sparsity after merge"),
    Metric("trainable_params", "trainable parameters", "trainable parameters"),
    Metric("train_loss", "last training loss (mean of the last logged steps)", "last training loss"),
    Metric("time_s", "wall time of the run in seconds", "time (s)"),
)}
"""The metrics a ``--metric`` may name."""


def _ppl(summary: dict[str, Any], stages: tuple[str, ...]) -> tuple[str | None, dict[str, Any]]:
    """The first perplexity entry of ``stages`` the summary holds, with its stage name."""
    ppl = summary.get("perplexity") or {}
    return next(((stage, ppl[stage]) for stage in stages
                 if isinstance(ppl.get(stage), dict) and ppl[stage].get("ppl") is not None), (None, {}))


def _with_interval(row: dict[str, Any], name: str, entry: dict[str, Any]) -> None:
    row[name] = entry.get("ppl")
    row[f"{name}_low"] = entry.get("ci_low")
    row[f"{name}_high"] = entry.get("ci_high")


def run_row(run: SweptRun, keys: list[str]) -> dict[str, Any]:
    """One run's row: ``run`` (its folder), each swept key's value, then the metrics of :data:`COMPARED_METRICS`
    (``None`` where the run did not measure one) and ``ppl_of``, the stage ``ppl`` was measured on."""
    s = run.summary
    row: dict[str, Any] = {"run": run.path.as_posix(), **{k: run.value(k) for k in keys}}
    stage, entry = _ppl(s, PPL_STAGES)
    _with_interval(row, "ppl", entry)
    row["ppl_of"] = stage
    _with_interval(row, "ppl_pruned", _ppl(s, ("pruned",))[1])
    _with_interval(row, "ppl_dense", _ppl(s, ("dense",))[1])
    sparsity = s.get("sparsity") or {}
    row["sparsity_after"] = sparsity.get("after", sparsity.get("before"))
    row["trainable_params"] = (s.get("params") or {}).get("trainable")
    row["train_loss"] = (s.get("losses") or {}).get("train_last")
    row["time_s"] = (s.get("timings") or {}).get("total")
    return row


def compare_rows(runs: list[SweptRun], keys: list[str]) -> list[dict[str, Any]]:
    """:func:`run_row` of every run."""
    return [run_row(run, keys) for run in runs]


def _number(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _with_ci(row: dict[str, Any], name: str) -> str:
    return _number(row.get(name)) + interval_text(row.get(f"{name}_low"), row.get(f"{name}_high"))


def markdown_table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    """The rows as a Markdown table: the swept keys, then perplexity ``ppl [low, high]`` (95 % bootstrap interval
    over the evaluation windows), pruned perplexity, sparsity after the merge, trainable parameters, time."""
    head = [*keys, "ppl [95 % interval]", "pruned ppl", "sparsity after merge", "trainable params",
            "last train loss", "time (s)", "run"]
    cells = [[*(str(row[k]) for k in keys), _with_ci(row, "ppl"), _with_ci(row, "ppl_pruned"),
              _number(row["sparsity_after"], 4), _number(row["trainable_params"]), _number(row["train_loss"], 3),
              _number(row["time_s"], 1), f"`{row['run']}`"] for row in rows]
    return "\n".join(markdown_lines(head, cells, left=len(head))) + "\n"


def csv_table(rows: list[dict[str, Any]]) -> str:
    """The rows as CSV, every column of :func:`run_row` (numbers at full precision, empty where not measured)."""
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return out.getvalue()
