"""A job's registry names are resolved once, into a frozen ``Run`` (``spp/training/run.py``).

``get_method(`` / ``get_pruner(`` appear only in the registries and in the resolver the ``Run`` is built from
(``spp/pruning/resolve.py``: it sits in ``spp.pruning`` so the pruning and reconstruction engines below
``spp.training`` can reach it for a script's bare config); ``run_job`` resolves each name once and builds one
``Run``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from train_helpers import tiny_job

import spp.commands.train as train_command
import spp.pruning.resolve as resolve
from spp.paths import REPO_ROOT
from spp.planning.job import job_spec
from spp.preflight.model_files import model_arch
from spp.pruning.base import Pruner
from spp.training.run import Run, build_run, resolve_methods
from spp.training.val_schedule import no_validation_reason
from train import run_job

LOOKUP = re.compile(r"\bget_(method|pruner)\(")
"""A registry lookup by name, as ``grep "get_method(\\|get_pruner("`` finds it."""

ALLOWED = {
    "spp/registry.py": "the registry shape itself",
    "spp/adapters/registry.py": "the adapter methods' registry",
    "spp/pruning/registry.py": "the pruners' registry",
    "spp/pruning/resolve.py": "the resolver: resolve_methods (spp/training/run.py) builds the Run from it",
}
"""Files that may look a name up in a registry, each with its reason."""

ALLOWED_FOLDERS: dict[str, str] = {}
"""Folders whose every file may look a name up (none: the planner resolves through the resolver too)."""


def lookups_outside(root: Path, package: str = "spp") -> list[str]:
    """``path:line`` of every registry lookup under ``root/package`` outside :data:`ALLOWED` and
    :data:`ALLOWED_FOLDERS`."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ALLOWED or any(rel.startswith(folder) for folder in ALLOWED_FOLDERS):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if LOOKUP.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_registry_lookups_only_in_the_registries_and_the_resolver():
    assert lookups_outside(REPO_ROOT) == []
    for rel in ALLOWED:
        assert (REPO_ROOT / rel).is_file(), f"stale allow-list entry {rel}"


def test_a_lookup_elsewhere_is_caught(tmp_path):
    """Negative control: a phase that looks its adapter method up by name again is named."""
    (tmp_path / "spp" / "training").mkdir(parents=True)
    (tmp_path / "spp" / "pruning").mkdir(parents=True)
    (tmp_path / "spp" / "training" / "phase.py").write_text("def f(job):\n    return get_method(job.adapter.name)\n")
    (tmp_path / "spp" / "pruning" / "resolve.py").write_text("x = get_pruner(cfg)\n")  # allowed
    assert lookups_outside(tmp_path) == ["spp/training/phase.py:2: return get_method(job.adapter.name)"]


def test_the_run_is_frozen_and_holds_the_resolved_objects(tmp_path):
    job = tiny_job(tmp_path, "objective=distill")
    run = build_run(job, tmp_path / "run")
    assert isinstance(run, Run) and isinstance(run.methods.pruner, Pruner) and run.methods.pruner.name == "wanda"
    assert run.methods.adapter.name == "spp" and run.methods.trains and run.methods.keeps_dense
    assert run.methods.form is None  # reconstruct=none
    assert run.identity.digest is not None and run.identity.key["model"] == run.identity.model
    for obj, field in ((run, "run_dir"), (run.methods, "pruner"), (run.identity, "digest")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)
    dense = build_run(tiny_job(tmp_path, "pruner=none"), tmp_path / "run")
    assert dense.methods.pruner is None and dense.identity.key is None  # nothing pruned: no pruner, no key
    none = resolve_methods(tiny_job(tmp_path, "adapter=none"))
    assert not none.trains and not none.keeps_dense


@pytest.fixture
def counted(monkeypatch):
    """Count the resolver's registry lookups and ``run_job``'s ``build_run`` calls."""
    calls = {"get_method": 0, "get_pruner": 0, "build_run": 0}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(resolve, "get_method", counting("get_method", resolve.get_method))
    monkeypatch.setattr(resolve, "get_pruner", counting("get_pruner", resolve.get_pruner))
    monkeypatch.setattr(train_command, "build_run", counting("build_run", train_command.build_run))
    return calls


def test_run_job_resolves_each_name_once(tmp_path, counted):
    job = tiny_job(tmp_path, "trainer.max_steps=2", "data.max_examples=16", "sample.enabled=false",
                   "dense_ppl=false")
    summary = run_job(job)
    assert summary is not None and summary["losses"]["optimizer_steps"] == 2
    assert counted == {"get_method": 1, "get_pruner": 1, "build_run": 1}
    no_validation_reason(job)  # the negative control: a phase resolving on its own is counted
    assert counted["get_method"] == 2


def test_a_reconstructing_run_resolves_its_form_once(tmp_path, counted):
    """The reconstruction's key (in the Run's identity) is computed with the resolved form, not a second lookup."""
    run = build_run(tiny_job(tmp_path, "reconstruct=blockwise"), tmp_path / "run")
    assert run.methods.form.name == "spp" and run.identity.reconstruction is not None
    assert counted == {"get_method": 2, "get_pruner": 1, "build_run": 0}  # the adapter and the form; the pruner
    assert run.identity.keys == ((run.identity.key, run.identity.digest), run.identity.reconstruction)


def test_the_plan_resolves_through_the_resolver(tmp_path, counted):
    """The planner's pruner, adapter method and reconstruction form come from the resolver (counted there) or from
    the job's resolved methods (``run_job``'s preflight), and the plan holds what the resolved objects say."""
    job = tiny_job(tmp_path, "pruner=sparsegpt", "adapter=norms", "reconstruct=blockwise")
    spec = job_spec(job, model_arch(job.model), "cpu", "tiny")
    assert spec.updates_weights and spec.adapter.name == "norms" and spec.reconstruct.form == "spp"
    assert counted["get_pruner"] >= 1 and counted["get_method"] >= 2  # the adapter and the form
    assert spec.uses_hessian  # SparseGPT's, asked of the resolved pruner
    resolved, before = resolve_methods(job), dict(counted)
    again = job_spec(job, model_arch(job.model), "cpu", "tiny", methods=resolved)
    assert again == spec and counted == before  # run_job's resolved methods: the same plan, no lookup again
    dense = job_spec(tiny_job(tmp_path, "pruner=none"), model_arch(job.model), "cpu", "tiny")
    assert not dense.prunes and not dense.updates_weights
