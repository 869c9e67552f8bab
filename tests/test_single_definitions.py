"""Each public top-level name of ``spp`` is defined in one module: a second ``def``, ``class`` or assignment of the
same name elsewhere is either a copy (import the one instead) or a second thing that should say what it is (rename
it). Names read with ``ast``; imports are not definitions. The allow-list holds the justified exceptions, each with
its reason."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from spp.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "spp"

EXCLUDED = ("experiments", "bench", "table1_params.py")
"""Parts of ``spp/`` that are moving out of the package (skipped while they are still there)."""

CONVENTION = "one per module by design: each module of its kind defines its own, found by module, never imported bare"

ALLOWED: dict[str, str] = {
    "log": "the module's own logger (logging.getLogger(__name__))",
    "T": "a generic module's own TypeVar",
    "main": "the command-line entry of a `python -m` module",
    "COMMAND": f"the command of a spp/commands module ({CONVENTION})",
    "run": f"the job function of a spp/commands module ({CONVENTION})",
    "METHOD": f"the registered instance of an adapter method module ({CONVENTION})",
    "FORMAT": f"an adapter method's own format tag in its files ({CONVENTION})",
    "META_NAME": f"an adapter method's own metadata file name ({CONVENTION})",
    "PEFT_TYPE": f"an adapter method's own peft type in adapter_config.json ({CONVENTION})",
    "seconds": f"a phase's time in a planning module, read as pruning.seconds / reconstruction.seconds ({CONVENTION})",
    "prune_phase": "the plan of the pruning phase (spp/planning/run.py, beside load_phase, fit_phase, ...) and the "
                   "phase itself (spp/training/callbacks/pruning.py)",
}


def public_names(tree: ast.Module) -> list[str]:
    """The public names a module's top level defines: functions, classes and assigned names (``__all__`` and
    private ``_names`` left out)."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_")]


def definitions(package: Path, excluded: tuple[str, ...] = EXCLUDED) -> dict[str, set[str]]:
    """``{name: {module path relative to the package's parent, ...}}`` over every module of ``package``."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in excluded:
            continue
        for name in public_names(ast.parse(path.read_text(), filename=str(path))):
            found[name].add(rel.as_posix())
    return found


def duplicates(package: Path, allowed: dict[str, str] = ALLOWED) -> dict[str, list[str]]:
    """The public names defined in more than one module and not allow-listed, with the modules."""
    return {name: sorted(where) for name, where in sorted(definitions(package).items())
            if len(where) > 1 and name not in allowed}


def test_each_public_name_is_defined_once() -> None:
    found = duplicates(PACKAGE)
    assert not found, ("public names defined in more than one module of spp/ (import the one, or rename the other "
                       "to say what it is):\n" + "\n".join(f"  {n}: {', '.join(w)}" for n, w in found.items()))


def test_every_allowed_name_is_still_defined_twice() -> None:
    """A stale allow-list entry would let a new duplicate of that name in unseen."""
    found = definitions(PACKAGE)
    stale = sorted(name for name in ALLOWED if len(found.get(name, ())) < 2)
    assert not stale, f"allow-listed but defined once or not at all (remove them from ALLOWED): {stale}"


def test_a_duplicate_is_found(tmp_path: Path) -> None:
    """Negative control: a module tree with one name defined twice (and the usual exclusions, private names and
    imports, which do not count)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "experiments").mkdir()
    (pkg / "a.py").write_text("TIMEOUT = 1\n\n\ndef helper():\n    pass\n\n\n_private = 2\n")
    (pkg / "sub" / "b.py").write_text("from pkg.a import helper\n\n\nclass TIMEOUT:\n    pass\n\n\n_private = 3\n")
    (pkg / "experiments" / "c.py").write_text("def helper():\n    pass\n")
    assert duplicates(pkg, allowed={}) == {"TIMEOUT": ["a.py", "sub/b.py"]}
    assert duplicates(pkg, allowed={"TIMEOUT": "a reason"}) == {}
