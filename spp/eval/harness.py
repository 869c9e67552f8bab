"""Run lm-eval (zero-shot tasks, 5-shot MMLU) on an in-memory model or a saved directory.

Offline, ``spp/eval/tasks/`` reads local copies of the eval sets; online, the names map to lm-eval's own tasks.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from spp.eval.progress_lines import lm_eval_bars_as_lines
from spp.eval.task_table import (
    MMLU_GROUP,
    PAPER_MEAN_TASKS,
    ZERO_SHOT_GROUP,
    aliases,
    get_task,
    group_members,
    include_paths,
    is_mmlu,
    known_tasks,
    online_names,
    unknown_task,
)
from spp.models.block_runner import in_eval_mode
from spp.paths import SAMPLE_DATA_DIR, find_data

if TYPE_CHECKING:
    from spp.eval.replicas import ReplicaGroup

log = logging.getLogger(__name__)


@dataclass
class HarnessResult:
    """Summary of an lm-eval run: ``metrics`` = ``{task: {"acc", "acc_norm", "acc_stderr", "n"}}`` (offline names).

    ``raw`` holds lm-eval's own ``results``/``groups``/``n-samples``/``n-shot``/``versions`` (+ ``samples``).
    """

    metrics: dict[str, dict[str, float]]
    limit: int | float | None
    num_fewshot: dict[str, int] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def zero_shot_mean(self) -> float | None:
        """The paper's 7-task mean of ``acc`` (``None`` unless all seven tasks ran)."""
        return zero_shot_mean(self.metrics)

    @property
    def mmlu_acc(self) -> float | None:
        """MMLU ``acc`` aggregated as lm-eval does (subjects weighted by size within and across categories)."""
        return self.metrics.get(MMLU_GROUP, {}).get("acc")


def resolve_tasks(tasks: str | Iterable[str]) -> list[str]:
    """Map config task names (``boolq``, ``zeroshot``, ``mmlu`` ...) to the table's offline task names.

    An unknown task raises a one-line ``UserError`` naming the accepted ones."""
    names = [tasks] if isinstance(tasks, str) else list(tasks)
    known, short = known_tasks(), aliases()
    resolved = [name if name in known else short.get(name) for name in names]
    if None in resolved:
        raise unknown_task(names[resolved.index(None)])
    return list(dict.fromkeys(resolved))


def leaf_tasks(tasks: Iterable[str]) -> list[str]:
    """Expand groups (``spp_zeroshot``, ``spp_mmlu``, ``spp_mmlu_<category>``) into their leaf tasks."""
    return list(dict.fromkeys(leaf for task in resolve_tasks(tasks) for leaf in group_members(task) or [task]))


def task_data_files(tasks: Iterable[str], data_dir: str | os.PathLike[str] | None = None) -> dict[str, list[Path]]:
    """Resolve every local file the offline ``tasks`` read, before any model is loaded.

    A missing file raises ``FileNotFoundError`` naming the searched paths and the ``data_dir`` fix."""
    files: dict[str, list[Path]] = {}
    for task in leaf_tasks(tasks):
        try:
            files[task] = [find_data(rel, data_dir) for rel in get_task(task).data_files]
        except FileNotFoundError as err:
            raise FileNotFoundError(f"eval task {task}: {err}") from err
    sampled = [t for t, paths in files.items() if any(p.is_relative_to(SAMPLE_DATA_DIR) for p in paths)]
    if sampled and tuple(sampled) not in _WARNED_SAMPLED:  # once per process and task list, not once per call
        _WARNED_SAMPLED.add(tuple(sampled))
        log.warning(
            "eval tasks %s read the truncated samples in %s (see data/README.md); set data_dir=<full copy> for the "
            "full sets", ", ".join(sampled[:8]) + (" ..." if len(sampled) > 8 else ""), SAMPLE_DATA_DIR,
        )
    return files


_WARNED_SAMPLED: set[tuple[str, ...]] = set()


def _quiet_custom_dataset_notice(record: logging.LogRecord) -> bool:
    """Drop lm-eval's per-task 'Custom kwargs can be passed to --metadata' notice (one per MMLU subject)."""
    return "Custom kwargs can be passed" not in record.getMessage()


def task_manager(data_dir: str | os.PathLike[str] | None = None, online: bool = False,
                 doc_seed: int | None = None) -> Any:
    """An lm-eval ``TaskManager``: offline with only the table's tasks (:func:`spp.eval.task_table.include_paths`),
    ``data_dir`` and ``doc_seed`` (seeded random document order, see :mod:`spp.eval.tasks.local_data`) in the task
    metadata."""
    from lm_eval.tasks import TaskManager

    if online:
        return TaskManager()
    logging.getLogger("lm_eval.api.task").addFilter(_quiet_custom_dataset_notice)
    meta: dict[str, Any] = {"data_dir": str(Path(data_dir).expanduser().resolve())} if data_dir else {}
    if doc_seed is not None:
        meta["doc_seed"] = int(doc_seed)
    return TaskManager(include_path=[str(p) for p in include_paths()], include_defaults=False, metadata=meta or None)


def _metric(entry: dict[str, Any], name: str) -> float | None:
    value = entry.get(f"{name},none")
    return None if value is None or value == "N/A" else float(value)


def summarize(lm_results: dict[str, Any], online: bool = False) -> dict[str, dict[str, float]]:
    """Flatten lm-eval's ``results`` into ``{offline task name: {acc, acc_stderr, acc_norm, acc_norm_stderr, n}}``."""
    back = {v: k for k, v in online_names().items()} if online else {}
    n_samples = lm_results.get("n-samples", {})
    out: dict[str, dict[str, float]] = {}
    for task, entry in lm_results.get("results", {}).items():
        metric = _own_metric(back.get(task, task))
        metrics = dict.fromkeys(("acc", "acc_stderr", "acc_norm", "acc_norm_stderr", metric, f"{metric}_stderr"))
        row = {m: v for m in metrics if (v := _metric(entry, m)) is not None}
        if task in n_samples:
            row["n"] = float(n_samples[task]["effective"])
        out[back.get(task, task)] = row
    if online and all(t in out for t in PAPER_MEAN_TASKS):
        out[ZERO_SHOT_GROUP] = {"acc": zero_shot_mean(out)}
    return out


def _own_metric(name: str) -> str:
    """The metric the table names for task ``name`` (``acc`` for groups and names it does not hold)."""
    return get_task(name).metric if name in known_tasks() and group_members(name) is None else "acc"


def zero_shot_mean(metrics: dict[str, dict[str, float]], metric: str = "acc") -> float | None:
    """Unweighted mean of ``metric`` over the seven zero-shot tasks (the paper's "Average"; Wanda uses acc)."""
    values = [metrics[t][metric] for t in PAPER_MEAN_TASKS if t in metrics and metric in metrics[t]]
    return sum(values) / len(values) if len(values) == len(PAPER_MEAN_TASKS) else None


def zero_shot_mean_stderr(metrics: dict[str, dict[str, float]], metric: str = "acc") -> float | None:
    """Standard error of the 7-task mean: ``sqrt(sum_i se_i^2) / 7`` from lm-eval's per-task ``<metric>_stderr``
    (tasks on disjoint documents, so independent); ``None`` unless all seven have one."""
    ses = [metrics[t].get(f"{metric}_stderr") for t in PAPER_MEAN_TASKS if t in metrics]
    if len(ses) != len(PAPER_MEAN_TASKS) or any(se is None for se in ses):
        return None
    return math.sqrt(sum(se * se for se in ses)) / len(ses)


def _run_names(names: list[str], online: bool) -> list[str]:
    """The names lm-eval runs: the local ``spp_*`` tasks, or online their standard tasks (the group expanded)."""
    if not online:
        return list(names)
    online_of = online_names()
    return [online_of[t] for name in names for t in (PAPER_MEAN_TASKS if name == ZERO_SHOT_GROUP else [name])]


def evaluate_tasks(
    model: torch.nn.Module | str,
    tokenizer: Any = None,
    tasks: str | Sequence[str] = (ZERO_SHOT_GROUP,),
    limit: int | float | None = None,
    batch_size: int | str = 1,
    data_dir: str | os.PathLike[str] | None = None,
    online: bool = False,
    log_samples: bool = False,
    doc_seed: int | None = None,
    replicas: ReplicaGroup | None = None,
) -> HarnessResult:
    """Evaluate with lm-eval's ``HFLM`` + ``simple_evaluate`` (0-shot tasks; MMLU 5-shot from its YAML).

    ``model`` is an in-memory LM (needs ``tokenizer``) or a saved directory (loaded on the CPU; with ``replicas``, on
    the replica's GPUs). ``limit`` takes the first documents, or with ``doc_seed`` a seeded random sample (ignored,
    with a warning, for ``online``). ``replicas`` splits every task's documents (every leader calls this and returns
    replica 0's result, with ``raw["placement"]``).
    """
    import lm_eval

    names = _checked(tasks, model, tokenizer, data_dir, online, doc_seed, limit)
    with in_eval_mode(model):  # entered first: HFLM's constructor calls model.eval()
        lm, model_args = _make_lm(model, tokenizer, batch_size, replicas)
        run_names = _run_names(names, online)
        with lm_eval_bars_as_lines():  # outside a terminal: a line per bar, not one huge line of redraws
            out = lm_eval.simple_evaluate(model=lm, tasks=run_names, limit=limit,
                                          log_samples=log_samples,
                                          task_manager=task_manager(data_dir, online, doc_seed))
    result = _shared(out, replicas, model_args, limit, online, doc_seed)
    log.info("lm-eval finished: %s", ", ".join(run_names))
    return result


def _checked(tasks: str | Sequence[str], model: Any, tokenizer: Any, data_dir: Any, online: bool,
             doc_seed: int | None, limit: int | float | None) -> list[str]:
    """The resolved task names, after checking the data files (offline) and that a model object has a tokenizer."""
    names = resolve_tasks(tasks)
    if not online:
        task_data_files(names, data_dir)
    if online and doc_seed is not None and limit is not None:
        log.warning("eval.doc_seed is ignored for online hub tasks: eval.limit takes their first documents")
    if not isinstance(model, (str, Path)) and tokenizer is None:
        raise ValueError("evaluate_tasks: an in-memory model needs its tokenizer (tokenizer=...)")
    return names


def _shared(out: dict[str, Any] | None, replicas: ReplicaGroup | None, model_args: dict[str, Any],
            limit: int | float | None, online: bool, doc_seed: int | None) -> HarnessResult:
    """lm-eval's output as a :class:`HarnessResult`; with ``replicas``, replica 0's on every leader, with how it
    ran in ``raw["placement"]``."""
    if replicas is None and out is None:
        raise RuntimeError("lm-eval returned no results (non-zero rank of a distributed run)")
    result = None
    if out is not None:
        raw = {k: out[k] for k in ("results", "groups", "n-samples", "n-shot", "versions", "samples") if k in out}
        shots = {k: int(v) for k, v in out.get("n-shot", {}).items()}
        result = HarnessResult(metrics=summarize(out, online), limit=limit, num_fewshot=shots,
                               raw={**raw, "doc_seed": doc_seed})
    if replicas is not None:
        result = replicas.broadcast_object(result, src=0)
        result.raw["placement"] = replicas.placement(model_args)
    return result


def _make_lm(model: torch.nn.Module | str | Path, tokenizer: Any, batch_size: int | str,
             replicas: ReplicaGroup | None) -> tuple[Any, dict[str, Any]]:
    """lm-eval's model object and, over ``replicas``, the ``--model_args`` it stands for (recorded as the placement)."""
    if replicas is not None:
        from spp.eval.distributed_lm import replica_lm  # start-up time: lm-eval's model classes (≈ 6 s) only here

        return replica_lm(model, tokenizer, replicas, batch_size)
    from lm_eval.models.huggingface import HFLM

    kwargs = {"device": "cpu"} if isinstance(model, (str, Path)) else {}
    return HFLM(pretrained=str(model) if isinstance(model, (str, Path)) else model, tokenizer=tokenizer,
                batch_size=batch_size, **kwargs), {}


def run_eval_tasks(
    model: torch.nn.Module | str | Path, tokenizer: Any, eval_cfg: Any,
    data_dir: str | os.PathLike[str] | None = None,
    replicas: ReplicaGroup | None = None,
) -> HarnessResult:
    """Run ``eval_cfg.tasks`` (the ``eval`` group) on an in-memory model (or a model directory).

    MMLU runs in a second lm-eval call with ``eval_cfg.mmlu_limit`` when that differs from ``limit``; metrics merge.
    """
    names = resolve_tasks(list(eval_cfg.tasks))
    mmlu_limit = eval_cfg.mmlu_limit
    split = mmlu_limit is not None and mmlu_limit != eval_cfg.limit
    batches = [(names, eval_cfg.limit)]
    if split:
        batches = [
            ([t for t in names if not is_mmlu(t)], eval_cfg.limit),
            ([t for t in names if is_mmlu(t)], mmlu_limit),
        ]
    results = [evaluate_tasks(model, tokenizer, tasks=tasks, limit=limit, batch_size=int(eval_cfg.lm_eval_batch_size),
                              data_dir=data_dir, online=bool(eval_cfg.online), replicas=replicas,
                              log_samples=bool(eval_cfg.log_samples),
                              doc_seed=eval_cfg.doc_seed if limit is not None else None)
               for tasks, limit in batches if tasks]
    if not results:
        raise ValueError("eval.tasks is empty; list tasks such as [spp_zeroshot, spp_mmlu]")
    merged = results[0]
    for res in results[1:]:
        merged.metrics.update(res.metrics)
        merged.num_fewshot.update(res.num_fewshot)
        if merged.raw.get("doc_seed") is None:
            merged.raw["doc_seed"] = res.raw.get("doc_seed")
        for key in ("results", "versions", "n-shot", "n-samples", "groups", "samples"):
            merged.raw.setdefault(key, {}).update(res.raw.get(key, {}))
    if split:
        merged.limit = eval_cfg.limit
        merged.raw["mmlu_limit"] = mmlu_limit
    return merged

