"""The raw files of the recovery study, read into plain records.

Layout under the campaign directory (``experiments/recovery/run.sh``): ``grid/<setting>/<method>/lr<rate>``
(seed-0 training runs, one per grid point), ``seeds/<setting>/<method>/s<seed>`` (more seeds at the chosen rate;
``.../lr<rate>/s<seed>`` at a runner-up rate), ``distill/...``, ``recovery/...`` and ``recovery_check/...`` (training
runs; the last a recovery run trained again on another machine), ``fresh/<setting>/<method>`` (as many steps on records
seen once), ``export/<setting>/masked_full`` and ``rerun/<setting>/<method>`` (the chosen run exported, or trained
again where a later checkout lacks its adapter, for zero-shot), ``reference/dense`` and ``reference/<setting>``
(``eval.py``: the dense and pruned models) and ``zero_shot/<setting>/<method>`` (``eval.py`` on the chosen seed-0 run's
adapter).
A setting is ``<sparsity>`` for Wanda, ``<sparsity>_<pruner>`` otherwise (``nm2_4_sparsegpt``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.labels import trained_from_summary
from spp.eval.doc_records import DOC_RECORDS_FILE, read_doc_records

TRAIN_KINDS = ("grid", "seeds", "distill", "recovery", "recovery_check", "fresh", "export", "rerun")
EVAL_KINDS = ("reference", "zero_shot")
SETTINGS = {"nm2_4": "Wanda 2:4", "unstructured50": "Wanda unstructured 50 %",
            "unstructured75": "Wanda unstructured 75 %", "nm2_4_sparsegpt": "SparseGPT 2:4"}
"""The campaign's settings in table order, with their labels."""
VAL_SOURCE = "wikitext2_val"
TEST_SOURCE = "wikitext2"


def setting_of(pruner: str, sparsity: str) -> str:
    """``wanda``, ``nm2_4`` -> ``nm2_4``; ``sparsegpt``, ``nm2_4`` -> ``nm2_4_sparsegpt``."""
    return sparsity if pruner == "wanda" else f"{sparsity}_{pruner}"


@dataclass(frozen=True)
class TrainRun:
    """One ``train.py`` run of the campaign: where it is, what it trained, what it measured."""

    rel: str
    kind: str
    setting: str
    method: str
    lr: float
    seed: int
    test: dict[str, Any]
    val: dict[str, Any] | None
    pruned_test: dict[str, Any] | None
    dense_test: dict[str, Any] | None
    alpaca_val: float | None
    train_s: float | None
    total_s: float | None
    steps: int
    trained: int
    machine: dict[str, Any] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class EvalRun:
    """One ``eval.py`` run: the dense or pruned model, or a chosen run's merged adapter."""

    rel: str
    kind: str
    setting: str
    method: str
    ppl: dict[str, dict[str, Any]]
    tasks: dict[str, dict[str, float]]
    docs: list[dict[str, Any]]
    total_s: float | None
    machine: dict[str, Any] = field(default_factory=dict)


@dataclass
class Campaign:
    """Every finished run below the campaign directory (a running or failed job has no summary and is absent)."""

    root: Path
    train: list[TrainRun]
    evals: list[EvalRun]


def cpu_name(machine: dict[str, Any]) -> str:
    """A run's CPU as its ``machine.json`` recorded it: model and torch's capability."""
    return f"{machine.get('cpu_model', '?')} ({machine.get('cpu_capability', '?')})"


def _machine(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "machine.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def method_of(data: dict[str, Any]) -> str:
    """The adapter's name, with ``+distill`` when the objective was distillation."""
    run = data["run"]
    return run["adapter"] + ("+distill" if run.get("objective") == "distill" else "")


def _trained(data: dict[str, Any]) -> int:
    return trained_from_summary(data["run"]["adapter"], data)


def load_train_run(path: Path, root: Path) -> TrainRun:
    """Read ``path`` (a ``summary.json``) of a training run below ``root``."""
    data = json.loads(path.read_text())
    rel = path.parent.relative_to(root)
    cfg, ppl, losses = data["config"], data["perplexity"], data.get("losses") or {}
    timings = data.get("timings") or {}
    return TrainRun(
        rel=rel.as_posix(), kind=rel.parts[0], setting=setting_of(data["run"]["pruner"], data["run"]["sparsity"]),
        method=method_of(data), lr=float(cfg["trainer"]["lr"]), seed=int(cfg["seed"]), test=ppl["merged"],
        val=(data.get("merged_ppl_by_source") or {}).get(VAL_SOURCE), pruned_test=ppl.get("pruned"),
        dense_test=ppl.get("dense"), alpaca_val=(losses.get("val") or [None])[-1], train_s=timings.get("train"),
        total_s=timings.get("total"), steps=int(losses.get("optimizer_steps") or 0), trained=_trained(data),
        machine=_machine(path.parent), curve=list(data.get("recovery_curve") or []))


def eval_seconds(record: dict[str, Any]) -> float | None:
    """An ``eval.py`` record's time: the sum of its stages (``info.timings``: pruning or its cache, loading, each
    perplexity, lm-eval); ``None`` when it recorded none."""
    timings = (record.get("info") or {}).get("timings") or {}
    return sum(float(v) for v in timings.values()) or None


def load_eval_run(path: Path, root: Path) -> EvalRun:
    """Read ``path`` (an ``eval.py`` ``results.json``) below ``root``; its place names what it evaluated."""
    rel = path.parent.relative_to(root)
    record = json.loads(path.read_text())["records"][0]
    if rel.parts[0] == "reference":
        setting, method = ("dense", "dense") if rel.parts[1] == "dense" else (rel.parts[1], "pruned")
    else:
        setting, method = rel.parts[1], rel.parts[2]
    docs_file = path.parent / DOC_RECORDS_FILE
    return EvalRun(rel=rel.as_posix(), kind=rel.parts[0], setting=setting, method=method, ppl=record.get("ppl") or {},
                   tasks=record.get("tasks") or {}, docs=read_doc_records(docs_file) if docs_file.is_file() else [],
                   total_s=eval_seconds(record), machine=_machine(path.parent))


def load(root: str | Path) -> Campaign:
    """Every finished run below ``root``, sorted by place.

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory: give the campaign directory "
                                "(experiments/results/runs/recovery)")
    train = [load_train_run(p, root) for p in sorted(root.glob("*/**/summary.json")) if
             p.relative_to(root).parts[0] in TRAIN_KINDS]
    evals = [load_eval_run(p, root) for p in sorted(root.glob("*/**/results.json")) if
             p.relative_to(root).parts[0] in EVAL_KINDS]
    return Campaign(root=root, train=train, evals=evals)
