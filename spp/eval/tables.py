"""Evaluation records, the paper's Table 2 in Markdown, ``results.json``, and logging to Lightning loggers.

Table 2 (like Wanda's) lists lm-eval ``acc`` per task and the unweighted 7-task mean; ``acc_norm`` goes in a
separate table so the two conventions never mix in one average."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spp.atomic import write_json_atomic, write_text_atomic
from spp.eval.config import EvalConfig
from spp.eval.harness import zero_shot_mean, zero_shot_mean_stderr
from spp.eval.task_table import MMLU_GROUP, PAPER_MEAN_TASKS, TASKS
from spp.loggers import log_final_metrics, log_table
from spp.report_text import markdown_lines, ppl_with_interval

PAPER_COLUMNS: tuple[tuple[str, str], ...] = tuple((t, TASKS[t].title) for t in PAPER_MEAN_TASKS)
"""(task, column title) of the paper's Table 2, in its order (the table's ``in_paper_mean`` rows)."""

ACC_NORM_TASKS: tuple[str, ...] = tuple(t for t in PAPER_MEAN_TASKS if TASKS[t].acc_norm)
"""The paper's tasks for which lm-eval also reports ``acc_norm`` (their separate table)."""


@dataclass
class EvalRecord:
    """Everything measured for one evaluated model (one table row); ``limit=None`` is every document."""

    label: str
    ppl: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)
    limit: int | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict, with the 7-task mean and MMLU accuracy added."""
        return {
            **asdict(self),
            "zero_shot_mean_acc": zero_shot_mean(self.tasks),
            "mmlu_acc": self.tasks.get(MMLU_GROUP, {}).get("acc"),
        }

    def flat_metrics(self) -> dict[str, float]:
        """``{"ppl/wikitext2": .., "acc/spp_boolq": .., "acc_norm/..": .., "acc/zero_shot_mean": ..}`` for loggers."""
        return {**{f"ppl/{src}": float(r["ppl"]) for src, r in self.ppl.items()}, **task_metrics(self.tasks)}


def task_metrics(tasks: dict[str, dict[str, float]]) -> dict[str, float]:
    """Logger keys of lm-eval results: ``acc/<task>``, ``acc_norm/<task>`` and ``acc/zero_shot_mean`` (7 tasks)."""
    out = {f"{name}/{task}": float(metrics[name]) for task, metrics in tasks.items() for name in ("acc", "acc_norm")
           if name in metrics}
    mean = zero_shot_mean(tasks)
    if mean is not None:
        out["acc/zero_shot_mean"] = mean
    return out


def final_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """A training job's end results as flat ``final/...`` scalars for the loggers, named as ``eval.py`` logs them:
    perplexities, per-task accuracies and the 7-task mean, sparsity before / after the merge, trainable parameters."""
    out: dict[str, float] = {}
    for stage, entry in (summary.get("perplexity") or {}).items():
        if entry:
            out[f"final/ppl_{stage}"] = float(entry["ppl"])
            for end in ("ci_low", "ci_high"):
                if entry.get(end) is not None:
                    out[f"final/ppl_{stage}_{end}"] = float(entry[end])
    main = ((summary.get("config") or {}).get("eval") or {}).get("ppl_source")
    out.update({f"final/ppl_merged_{src}": float(entry["ppl"])  # eval.extra_ppl_sources of the merged model
                for src, entry in (summary.get("merged_ppl_by_source") or {}).items() if entry and src != main})
    out.update({f"final/{key}": float(value) for key, value in (summary.get("gap_closed") or {}).items()
                if key.startswith("gap_closed")})
    out.update(reconstruction_metrics(summary.get("reconstruction")))
    zero_shot = (summary.get("zero_shot") or {}).get("metrics") or {}
    out.update({f"final/{key}": value for key, value in task_metrics(zero_shot).items()})
    out.update({f"final/{name}": float(value) for name, (part, key) in SUMMARY_SCALARS.items()
                if (value := (summary.get(part) or {}).get(key)) is not None})
    return out


SUMMARY_SCALARS: dict[str, tuple[str, str]] = {
    "sparsity_before": ("sparsity", "before"),
    "sparsity_after": ("sparsity", "after"),
    "trainable_params": ("params", "trainable"),
    "remask_removed_fraction": ("merge", "removed_fraction"),
}
"""``final/<name>`` scalars of :func:`final_metrics` read from ``summary[part][key]``."""


def reconstruction_metrics(record: dict[str, Any] | None) -> dict[str, float]:
    """Block-wise reconstruction's losses as ``final/reconstruct_...`` scalars: each block's loss at its start and
    end (``..._block07_start``), and their means over the blocks."""
    record = record or {}
    out = {f"final/reconstruct_loss_block{block['block']:02d}_{end}": float(block[f"loss_{end}"])
           for block in record.get("blocks") or [] for end in ("start", "end")}
    return out | {f"final/reconstruct_loss_{end}_mean": float(record[f"loss_{end}_mean"]) for end in ("start", "end")
                  if record.get(f"loss_{end}_mean") is not None}


def _pct(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.2f}"


DEFAULT_DOC_SEED = EvalConfig.doc_seed
"""The ``eval.doc_seed`` a record made before ``info.doc_seed`` was recorded used (the config's default)."""

FEW_WINDOWS = 5
"""Below this many windows a bootstrap interval over windows is a rough range: it is printed with a caveat."""


def few_windows_caveat(windows: int | None) -> str:
    """`` (2 windows: a rough interval)`` for an interval from fewer than :data:`FEW_WINDOWS` windows, else ``""``."""
    if windows is None or windows >= FEW_WINDOWS:
        return ""
    return f" ({windows} window{'s' if windows != 1 else ''}: a rough interval)"


def ppl_text(entry: dict[str, Any]) -> str:
    """:func:`ppl_with_interval` (the 95 % bootstrap interval over windows: ``136.65 [120.10, 150.30]``), with
    :func:`few_windows_caveat` when the interval comes from fewer than 5 windows."""
    caveat = few_windows_caveat(entry.get("windows")) if entry.get("ci_low") is not None else ""
    return ppl_with_interval(entry) + caveat


def _mean_text(tasks: dict[str, dict[str, float]]) -> str:
    mean, se = zero_shot_mean(tasks), zero_shot_mean_stderr(tasks)
    return f"{_pct(mean)} (se {_pct(se)})" if mean is not None and se is not None else _pct(mean)


def _ppl_header(records: Sequence[EvalRecord], source: str) -> str:
    settings = {(r.ppl[source]["seqlen"], r.ppl[source]["windows"]) for r in records if source in r.ppl}
    if len(settings) == 1:
        seqlen, windows = settings.pop()
        return f"{source} PPL ({seqlen}×{windows})"
    return f"{source} PPL"


def paper_table(records: Sequence[EvalRecord]) -> str:
    """Markdown: rows = models; columns = perplexities, the 7 zero-shot ``acc`` (%), Average, MMLU 5-shot (%)."""
    sources = list(dict.fromkeys(src for r in records for src in r.ppl))
    head = ["Model", *(_ppl_header(records, s) for s in sources), *(t for _, t in PAPER_COLUMNS), "Average", "MMLU"]
    rows = [[r.label, *(ppl_text(r.ppl[s]) if s in r.ppl else "–" for s in sources),
             *(_pct(r.tasks.get(task, {}).get("acc")) for task, _ in PAPER_COLUMNS), _mean_text(r.tasks),
             _pct(r.tasks.get(MMLU_GROUP, {}).get("acc"))] for r in records]
    return "\n".join(markdown_lines(head, rows + _majority_rows(records, len(sources))))


def paper_values(tasks: dict[str, dict[str, float]]) -> list[float | None]:
    """Table 2's numbers of one row: the seven tasks' ``acc``, their mean, MMLU's ``acc`` (``None`` where missing)."""
    return [*(tasks.get(task, {}).get("acc") for task, _ in PAPER_COLUMNS), zero_shot_mean(tasks),
            tasks.get(MMLU_GROUP, {}).get("acc")]


def _majority_rows(records: Sequence[EvalRecord], ppl_columns: int) -> list[list[str]]:
    """A "majority class" row per distinct set of scored documents (``info["majority_class"]``, written with
    ``eval.log_samples=true``): the accuracy of always giving each task's most frequent correct answer."""
    distinct = {json.dumps(m, sort_keys=True): m for r in records if (m := r.info.get("majority_class"))}
    return [["majority class (scored documents)", *["–"] * ppl_columns, *map(_pct, paper_values(majority))]
            for majority in distinct.values()]


def acc_norm_table(records: Sequence[EvalRecord]) -> str:
    """Markdown of lm-eval's ``acc_norm`` (%) for the four tasks that report it."""
    titles = dict(PAPER_COLUMNS)
    head = ["Model", *(titles[t] + " (acc_norm)" for t in ACC_NORM_TASKS)]
    rows = [[r.label, *(_pct(r.tasks.get(t, {}).get("acc_norm")) for t in ACC_NORM_TASKS)] for r in records]
    return "\n".join(markdown_lines(head, rows))


def limit_notes(records: Sequence[EvalRecord], limits: list[str], mmlu_limits: list[str]) -> list[str]:
    """What ``eval.limit`` / ``eval.mmlu_limit`` scored: a seeded random sample of each task's documents
    (``eval.doc_seed``, recorded as ``info.doc_seed``; 0 by default), or the first N with ``eval.doc_seed=null``."""
    seeds = sorted({str(r.info.get("doc_seed", DEFAULT_DOC_SEED)) for r in records if r.tasks})
    if seeds == ["None"]:
        how = "the first N documents of each task file (eval.doc_seed=null)"
    else:
        seed = ", ".join(seeds)
        how = (f"a seeded random sample of N documents per task (eval.doc_seed={seed}; plain lm-eval scores the same "
               f"ones with this project's task folders and `metadata={{\"doc_seed\": {seed}}}`, while "
               "`lm_eval --limit N` alone takes other documents)")
    lines = [f"lm-eval `limit` N per zero-shot task: {', '.join(limits)}; {how}."] if limits else []
    if mmlu_limits:
        lines.append(f"MMLU `limit` (test questions per subject, 57 subjects, sampled the same way): "
                     f"{', '.join(mmlu_limits)}.")
    return lines


def notes(records: Sequence[EvalRecord]) -> str:
    """The protocol lines printed under the tables (metric per task, limits, shots, perplexity windows)."""
    limits = sorted({str(r.limit) for r in records if r.tasks})
    mmlu_limits = sorted({str(r.info.get("mmlu_limit")) for r in records if MMLU_GROUP in r.tasks})
    lines = [
        "Zero-shot columns: lm-eval `acc` (%) for all seven tasks (the Wanda/SPP Table 2 convention); "
        "Average = unweighted mean of the seven `acc`. MMLU: 5-shot `acc` (%), subjects aggregated as lm-eval "
        "aggregates `mmlu` (weighted by documents within and across the four categories).",
        "Perplexity: non-overlapping windows (seqlen × windows in the header), tail dropped, exp(mean token NLL); "
        "wikitext2 = raw test split joined by blank lines; c4 = the local sample of C4 *train* shard 0.",
    ]
    lines += limit_notes(records, limits, mmlu_limits)
    if any(t not in r.tasks for r in records if r.tasks for t in PAPER_MEAN_TASKS):
        lines.append("'–' = not evaluated.")
    files = {f["path"]: f for r in records for f in r.info.get("data_files") or []}
    if files:
        listed = "; ".join(f"`{p}` sha256 {f['sha256'][:12]}" + (" (**truncated sample**)" if f["truncated_sample"]
                                                                  else "") for p, f in sorted(files.items()))
        lines.append(f"Data files read: {listed}.")
    return "\n".join(f"- {line}" for line in lines)


def markdown_report(records: Sequence[EvalRecord], title: str = "Evaluation") -> str:
    """The full Markdown report: Table-2-shaped table, acc_norm table, protocol notes."""
    parts = [f"# {title}", "", paper_table(records), ""]
    if any(t in r.tasks for r in records for t in ACC_NORM_TASKS):
        parts += ["acc_norm (length-normalised accuracy, reported separately):", "", acc_norm_table(records), ""]
    parts += [notes(records), ""]
    return "\n".join(parts)


def write_results(
    out_dir: str | os.PathLike[str], records: Sequence[EvalRecord], meta: dict[str, Any] | None = None,
    title: str = "Evaluation",
) -> tuple[Path, Path]:
    """Write ``results.json`` and ``results.md`` (atomically) into ``out_dir``; return both paths."""
    out = Path(out_dir)
    js = write_json_atomic(out / "results.json", {"meta": meta or {}, "records": [r.to_dict() for r in records]})
    md = write_text_atomic(out / "results.md", markdown_report(records, title))
    return js, md


def log_to_loggers(loggers: Sequence[Any], records: Sequence[EvalRecord]) -> None:
    """Log each record's metrics (prefixed by its row index) and, on W&B, the Table-2 table as a ``wandb.Table``."""
    for i, r in enumerate(records):
        prefix = f"eval/{i}/" if len(records) > 1 else "eval/"
        log_final_metrics(loggers, {prefix + k: v for k, v in r.flat_metrics().items()}, step=0)
    log_table(loggers, "eval/table2", ["model", *(t for _, t in PAPER_COLUMNS), "Average", "MMLU"],
              [[r.label, *paper_values(r.tasks)] for r in records])
