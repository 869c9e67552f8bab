"""Find the runs of a sweep and the config keys that differ between them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spp.errors import UserError
from spp.report_text import dotted_keys

SUMMARY = "summary.json"
NOT_SWEPT: frozenset[str] = frozenset({
    "cache_dir", "data_dir", "run_dir", "output_dir", "logger", "print_config", "plan", "plan_json",
    "cache_lock_timeout_s",
})
"""Keys that say where outputs go or how a run reports, never what it measured: left out of the swept keys."""
MISSING = "-"
"""The value of a key a run does not have (an override it was not given and a config without the key)."""


@dataclass(frozen=True)
class SweptRun:
    """One run of a sweep: its folder (relative to the compared folder), summary and recorded settings."""

    path: Path
    """The run's folder, relative to the folder being compared (``.`` when that folder is the run)."""
    summary: dict[str, Any]
    config: dict[str, Any]
    """The resolved config the run recorded (``summary.json``'s ``config``, else ``.hydra/config.yaml``)."""
    overrides: dict[str, str] = field(default_factory=dict)
    """The command line's ``key=value`` overrides (``.hydra/overrides.yaml``; ``+``/``++`` prefixes dropped)."""

    def value(self, key: str) -> str:
        """The run's value of ``key``: from its config (a config group's chosen option is ``<group>.name``), else
        from its overrides, else :data:`MISSING`; as text (``4``, ``nm2_4``, ``0.001``, ``True``)."""
        found = _lookup(self.config, key)
        if isinstance(found, dict):
            found = found.get("name", self.overrides.get(key, MISSING))
        elif found is None or found is _ABSENT:  # null or absent in the config: the override, else as recorded
            found = self.overrides.get(key, MISSING if found is _ABSENT else None)
        return _text(found)


_ABSENT = object()


def _lookup(tree: dict[str, Any], key: str) -> Any:
    """``tree["a"]["b"]`` for ``a.b``; ``_ABSENT`` when a part is absent."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _text(value: Any) -> str:
    """A config value as one short string (lists joined with ``+``)."""
    if isinstance(value, list | tuple):
        return "+".join(_text(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _read_overrides(run_dir: Path) -> dict[str, str]:
    """``.hydra/overrides.yaml`` as ``{key: value}`` (empty when the run has none)."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for item in yaml.safe_load(path.read_text()) or []:
        key, sep, value = str(item).partition("=")
        if sep and not key.startswith(("~", "hydra.")):
            out[key.lstrip("+")] = value
    return out


def _read_config(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The run's resolved config: ``summary.json``'s own, else ``.hydra/config.yaml``."""
    if isinstance(summary.get("config"), dict):
        return summary["config"]
    path = run_dir / ".hydra" / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def find_runs(folder: str | Path) -> list[SweptRun]:
    """Every ``train.py`` run below ``folder`` at any depth, in path order (Hydra's job numbers sort within a sweep).

    ``UserError`` when ``folder`` does not exist or holds no ``train.py`` ``summary.json``."""
    root = Path(folder)
    fix = "give a train.py run folder or a multirun folder (e.g. multirun/<date>/<time>) that holds summary.json files"
    if not root.is_dir():
        raise UserError(f"{root} is not a folder", fix, path=root)
    runs = []
    for path in sorted(root.rglob(SUMMARY), key=lambda p: _natural(p.relative_to(root))):
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(summary, dict) or "perplexity" not in summary or "params" not in summary:
            continue  # an eval.py or study summary, not a training run
        run_dir = path.parent
        runs.append(SweptRun(run_dir.relative_to(root), summary, _read_config(run_dir, summary),
                             _read_overrides(run_dir)))
    if not runs:
        raise UserError(f"no runs under {root} (no train.py summary.json below it)", fix, path=root)
    return runs


def _natural(path: Path) -> tuple[tuple[int, str], ...]:
    """Sort key for a path whose parts start with job numbers: ``10_x`` after ``9_x``."""
    return tuple((int(head), part) if (head := part.split("_", 1)[0]).isdigit() else (-1, part)
                 for part in path.parts)


def swept_keys(runs: list[SweptRun]) -> list[str]:
    """The keys whose values differ between ``runs``, in the order of the first command line that names them.

    When the overrides explain no difference (no ``.hydra/``, different scripts), the differing config keys are used,
    a group's keys folded into the group when its ``name`` differs; :data:`NOT_SWEPT` keys are left out."""
    keys = list(dict.fromkeys(k for run in runs for k in run.overrides if k.split(".")[0] not in NOT_SWEPT))
    differing = [k for k in keys if len({run.value(k) for run in runs}) > 1]
    return differing or _config_differences(runs)


def _config_differences(runs: list[SweptRun]) -> list[str]:
    """The recorded config keys that differ between ``runs``; a group whose ``name`` differs stands for its keys."""
    flat = [dotted_keys(run.config) for run in runs]
    all_keys = list(dict.fromkeys(k for f in flat for k in f))
    differ = [k for k in all_keys if k.split(".")[0] not in NOT_SWEPT
              and len({_text(f.get(k, MISSING)) for f in flat}) > 1]
    groups = sorted({k.rpartition(".")[0] for k in differ if k.endswith(".name")}, key=len)
    return list(dict.fromkeys(next((g for g in groups if k.startswith(g + ".")), k) for k in differ))
