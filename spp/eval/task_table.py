"""The one table of evaluation tasks: every lm-eval task ``eval.tasks`` accepts is a row (:class:`EvalTask`).

Plug-ins add rows with :func:`register_task`; an unknown name is refused, never taken for an MMLU subject."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from spp.errors import UserError
from spp.eval.mmlu_tasks import CATEGORIES, MMLU_SUBJECTS
from spp.registry import Registry

TASK_DIR: Path = Path(__file__).resolve().parent / "tasks"
"""The project's own YAMLs: lm-eval's ``include_path`` (also for the ``lm_eval`` command line)."""

ZERO_SHOT_GROUP = "spp_zeroshot"
"""The group of the paper's seven tasks (``tasks/spp_zeroshot.yaml``; its ``acc`` = the 7-task mean)."""
MMLU_GROUP = "spp_mmlu"
"""The MMLU group (-> ``spp_mmlu_<category>`` -> ``spp_mmlu_<subject>``)."""
GROUP_ALIASES: dict[str, str] = {"zeroshot": ZERO_SHOT_GROUP, "zero_shot": ZERO_SHOT_GROUP}

TaskKind = Literal["zero_shot", "mmlu"]


@dataclass(frozen=True)
class EvalTask:
    """One lm-eval task that ``eval.tasks`` accepts.

    ``name`` is its YAML's ``task:``; ``online_name`` lm-eval's standard task it mirrors (``eval.online=true``);
    ``data_files`` are relative to a data root; ``loader`` the ``custom_dataset`` function its YAML names; ``kind`` is
    ``zero_shot`` or ``mmlu`` (5-shot)."""

    name: str
    online_name: str
    data_files: tuple[str, ...]
    loader: str
    metric: str = "acc"
    in_paper_mean: bool = False
    kind: TaskKind = "zero_shot"
    title: str = ""
    acc_norm: bool = False
    include_path: Path = TASK_DIR


def unknown_task(name: str, known: list[str] | None = None) -> UserError:
    """The one-line refusal of an unknown ``eval.tasks`` entry, naming every accepted task."""
    own = [t for t, row in _TASKS.items() if row.kind != "mmlu"]
    names = ", ".join([ZERO_SHOT_GROUP, MMLU_GROUP, *own, f"{MMLU_GROUP}_<category or subject>"])
    return UserError(f"unknown eval task {name!r} in eval.tasks; known: {names} (or the same without 'spp_')",
                     "fix eval.tasks, or register the task (docs/architecture.md, 'How to add an evaluation task')",
                     key="eval.tasks")


REGISTRY: Registry[EvalTask] = Registry("eval task", "eval.tasks", unknown=unknown_task)
"""Every task's row by name (:func:`register_task`)."""
_TASKS: dict[str, EvalTask] = REGISTRY.entries
TASKS: MappingProxyType[str, EvalTask] = MappingProxyType(_TASKS)
"""Every registered task by name (read-only; add rows with :func:`register_task`)."""
_sealed = False


def register_task(task: EvalTask) -> EvalTask:
    """Add ``task`` to the table and return it (twice is a no-op); a taken or ``spp_mmlu*`` name, an unknown kind,
    or a plug-in task in the paper's mean raises ``UserError``."""
    if _TASKS.get(task.name) == task:
        return task
    fix = "give the task another name (see docs/architecture.md, 'How to add an evaluation task')"
    caller = inspect.currentframe().f_back.f_code.co_filename  # type: ignore[union-attr]
    taken = known_tasks() | set(aliases())
    if task.name in taken or task.online_name in taken:
        raise UserError(f"eval task {task.name!r} (online name {task.online_name!r}): the name is already taken "
                        f"(by {_holder(task)}; again by {caller})", fix)
    if _sealed and (task.kind == "mmlu" or task.name.startswith(MMLU_GROUP)):
        raise UserError(f"eval task {task.name!r}: spp_mmlu* names and kind='mmlu' are the 57 MMLU subjects", fix)
    if task.kind not in ("zero_shot", "mmlu"):
        raise UserError(f"eval task {task.name!r}: kind={task.kind!r} is not 'zero_shot' or 'mmlu'",
                        "use kind='zero_shot'")
    if _sealed and task.in_paper_mean:
        raise UserError(f"eval task {task.name!r}: the paper's mean is its seven tasks ({', '.join(PAPER_MEAN_TASKS)})",
                        "register it with in_paper_mean=False (it is reported beside them)")
    REGISTRY.register(task.name, task, source=caller)
    return task


def _holder(task: EvalTask) -> str:
    """The file that registered the row whose name or online name ``task`` takes (this one for a group's name)."""
    return next((REGISTRY.sources[name] for name, row in _TASKS.items()
                 if {task.name, task.online_name} & {name, row.online_name}), __file__)


def get_task(name: str) -> EvalTask:
    """The row of ``name`` (an offline task name, not a group); ``UserError`` when there is none."""
    return REGISTRY.get(name)


def group_members(group: str) -> list[str] | None:
    """The rows a group stands for (``spp_zeroshot``: the paper's seven; ``spp_mmlu``, ``spp_mmlu_<category>``:
    their subjects); ``None`` for a name that is no group."""
    if group == ZERO_SHOT_GROUP:
        return list(PAPER_MEAN_TASKS)
    if group == MMLU_GROUP:
        return [f"{MMLU_GROUP}_{s}" for s in MMLU_SUBJECTS]
    category = group.removeprefix(f"{MMLU_GROUP}_")
    if group.startswith(f"{MMLU_GROUP}_") and category in CATEGORIES:
        return [f"{MMLU_GROUP}_{s}" for s, c in MMLU_SUBJECTS.items() if c == category]
    return None


def is_mmlu(name: str) -> bool:
    """Whether a resolved task or group name is MMLU (the group, a category or a subject)."""
    return name == MMLU_GROUP or (name.startswith(f"{MMLU_GROUP}_") and group_members(name) is not None) or (
        name in _TASKS and _TASKS[name].kind == "mmlu")


def online_names() -> dict[str, str]:
    """Offline task or group name -> the standard lm-eval task of which it is a local mirror."""
    return {**{name: task.online_name for name, task in _TASKS.items() if task.kind != "mmlu"}, MMLU_GROUP: "mmlu",
            **{f"{MMLU_GROUP}_{c}": f"mmlu_{c}" for c in CATEGORIES},
            **{name: task.online_name for name, task in _TASKS.items() if task.kind == "mmlu"}}


def aliases() -> dict[str, str]:
    """Short names accepted in configs (``boolq``, ``mmlu``, ``zeroshot`` ...) -> offline task or group names."""
    return {**{v: k for k, v in online_names().items()}, **GROUP_ALIASES}


def known_tasks() -> frozenset[str]:
    """Every offline task and group name ``eval.tasks`` accepts (besides the short names of :func:`aliases`)."""
    return frozenset([*online_names(), ZERO_SHOT_GROUP])


def include_paths() -> list[Path]:
    """The folders lm-eval searches for task YAMLs: :data:`TASK_DIR` first, then each plug-in's."""
    return list(dict.fromkeys([TASK_DIR, *(t.include_path for t in _TASKS.values())]))


def _register_own() -> tuple[str, ...]:
    """The project's rows: the paper's seven zero-shot tasks, then the 57 MMLU subjects; returns the seven."""
    own = [
        ("boolq", "BoolQ", "boolq/val.jsonl", False),
        ("rte", "RTE", "rte/val.jsonl", False),
        ("hellaswag", "HellaSwag", "hellaswag/hellaswag_val_full.txt", True),
        ("winogrande", "WinoGrande", "winogrande/winogrande.jsonl", False),
        ("arc_easy", "ARC-e", "arc/ARC-Easy-Test.jsonl", True),
        ("arc_challenge", "ARC-c", "arc/ARC-Challenge-Test.jsonl", True),
        ("openbookqa", "OBQA", "openbookqa/test.tsv", True),
    ]
    for short, title, path, norm in own:
        register_task(EvalTask(f"spp_{short}", short, (path,), f"spp.eval.tasks.local_data.{short}",
                               in_paper_mean=True, title=title, acc_norm=norm))
    for subject in MMLU_SUBJECTS:
        register_task(EvalTask(f"{MMLU_GROUP}_{subject}", f"mmlu_{subject}",
                               (f"mmlu/test/{subject}_test.csv", f"mmlu/dev/{subject}_dev.csv"),
                               "spp.eval.tasks.local_data.mmlu", kind="mmlu", title=subject))
    return tuple(name for name, task in _TASKS.items() if task.in_paper_mean)


PAPER_MEAN_TASKS: tuple[str, ...] = _register_own()
"""The paper's seven zero-shot tasks (Table 2's columns, in order): the 7-task mean is the mean of their ``acc``."""
_sealed = True
