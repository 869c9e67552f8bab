"""Methods own their names: no module of ``spp/`` outside a method's folder names that method's classes or its
registered name. The rest of the project asks a method through its interface (``spp.adapters.base``,
``spp.pruning.base``, ``spp.training.objectives.base``) and its registry.

Read with ``ast``: each folder of ``spp/adapters/methods/``, ``spp/pruning/pruners/`` and
``spp/training/objectives/`` is a method; its classes are those defined in its modules, its name the folder's name.
Every other module under ``spp/`` is searched for an identifier or attribute equal to one of those classes and for
a string constant equal to the name (docstrings excepted). What remains is :data:`ALLOWED`, each entry with its
reason.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from spp.paths import REPO_ROOT

ROOT = REPO_ROOT / "spp"
METHOD_DIRS = ("adapters/methods", "pruning/pruners", "training/objectives")
"""Where the method folders are, under ``spp/``."""

GENERIC = {"none": "every group's 'off' value (adapter, pruner, reconstruct), not one method"}
"""Names that are also a generic value; a string equal to them is not a use of the method."""

PACKAGE = "the package's own name (also SPP's method name), not the method"
ALLOWED: dict[tuple[str, str], str] = {
    ("spp/adapters/methods/sparse_lora/config.py", "LoRAConfig"): "SparsePEFT's config extends LoRA*'s keys (one "
                                                                  "method built on another's public config)",
    ("spp/adapters/methods/losa/config.py", "LoRAConfig"): "LoSA's config extends LoRA*'s keys (as SparsePEFT's)",
    ("spp/adapters/methods/losa/method.py", "SparseLoRA"): "LoSA merges, saves and audits as SparsePEFT (its "
                                                           "folders load masked in peft as SparsePEFT's)",
    ("spp/adapters/registry.py", "spp"): "adapter folders written before adapter_method.json say format 'spp'",
    ("spp/pruning/pruners/dsnot/pruner.py", "wanda"): "DS⊘T's initial mask is another pruner's rule "
                                                      "(pruner.initial_method, the reference's choices)",
    ("spp/pruning/pruners/dsnot/pruner.py", "sparsegpt"): "DS⊘T's initial-mask choice (as above)",
    ("spp/pruning/pruners/dsnot/pruner.py", "magnitude"): "DS⊘T's initial-mask choice (as above)",
    ("spp/loggers.py", "ce"): "run names leave out the paper's objective (objective=ce)",
    ("spp/loggers.py", "spp"): PACKAGE + " (the W&B project)",
    ("spp/paths.py", "spp"): PACKAGE + " (the cache folder ~/.cache/spp)",
    ("spp/slurm.py", "spp"): PACKAGE + " (the program name in a message)",
    ("spp/training/report.py", "spp"): PACKAGE + " (its version in summary.json)",
    ("spp/training/objectives/base.py", "ce"): "the schema default of objective.name (spp/training/ is not ours)",
    ("spp/training/objectives/distill/__init__.py", "ce"): "distillation's cross-entropy term is logged as 'ce'",
}
"""``(module path, name) -> why`` a module outside a method's folder names it."""


def method_folders(root: Path = ROOT) -> dict[Path, tuple[str, set[str]]]:
    """Every method folder under ``root``: ``{folder: (name, classes defined in its modules)}``."""
    out: dict[Path, tuple[str, set[str]]] = {}
    for group in METHOD_DIRS:
        for folder in sorted(p for p in (root / group).iterdir() if (p / "__init__.py").is_file()):
            classes = {node.name for path in folder.rglob("*.py")
                       for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                       if isinstance(node, ast.ClassDef)}
            out[folder] = (folder.name, classes)
    return out


def docstring_nodes(tree: ast.AST) -> set[int]:
    """``id`` of every docstring constant of ``tree`` (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


@cache
def names_in(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``(identifiers, strings)`` of source ``text`` as ``(line, value)``: every name, attribute and imported name,
    and every string constant that is not a docstring."""
    tree = ast.parse(text)
    docs = docstring_nodes(tree)
    idents: list[tuple[int, str]] = []
    strings: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            idents.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            idents.append((node.lineno, node.attr))
        elif isinstance(node, ast.alias):
            idents.append((getattr(node, "lineno", 0), node.name.split(".")[-1]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            strings.append((node.lineno, node.value))
    return idents, strings


def offenders(root: Path = ROOT, allowed: dict[tuple[str, str], str] | None = None) -> list[str]:
    """``path:line name (method folder)`` for each module of ``root`` outside a method's folder that names the
    method (one of its classes, or its name as a string), less ``allowed``."""
    allowed = ALLOWED if allowed is None else allowed
    folders = method_folders(root)
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        idents, strings = names_in(path.read_text(encoding="utf-8"))
        for folder, (name, classes) in folders.items():
            if folder in path.parents:
                continue
            used = [(line, v) for line, v in idents if v in classes]
            used += [(line, v) for line, v in strings if v == name and name not in GENERIC]
            out += [f"{rel}:{line} {v} ({folder.relative_to(root.parent).as_posix()})" for line, v in sorted(used)
                    if (rel, v) not in allowed]
    return out


def test_no_module_outside_a_method_folder_names_the_method() -> None:
    found = offenders()
    assert found == [], ("these modules name a method outside its folder; ask the method through its interface "
                         "or registry, or add an entry with its reason to ALLOWED: " + "; ".join(found))


def test_every_allowed_entry_is_still_needed() -> None:
    """An entry whose module no longer names the method is removed from :data:`ALLOWED`."""
    stale = [key for key in ALLOWED if key not in {tuple(o.split(" ")[0].split(":")[:1]) + (o.split(" ")[1],)
                                                   for o in offenders(allowed={})}]
    assert stale == [], f"ALLOWED entries no longer needed: {stale}"


def test_the_walk_sees_the_methods() -> None:
    folders = {name: classes for name, classes in method_folders().values()}
    assert {"spp", "lora", "masked_full", "norms", "sparse_lora", "wanda", "sparsegpt", "ce"} <= set(folders)
    assert "SPPLinear" in folders["spp"] and "MaskedFull" in folders["masked_full"]


def test_a_module_naming_a_method_is_caught(tmp_path: Path) -> None:
    """Negative control: a copy of ``spp/`` with one more module naming ``SPPLinear`` and ``"masked_full"``."""
    root = tmp_path / "spp"
    for group in METHOD_DIRS:
        for folder in (ROOT / group).iterdir():
            for path in folder.rglob("*.py"):
                target = root / path.relative_to(ROOT)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    (root / "export").mkdir()
    (root / "export" / "writer.py").write_text(
        '"""masked_full in a docstring is fine."""\nfrom spp.adapters.methods.spp.layer import SPPLinear\n\n'
        'def f(m):\n    return isinstance(m, SPPLinear) or m.name == "masked_full" or m.name == "none"\n',
        encoding="utf-8")
    found = [o for o in offenders(root, allowed={}) if o.startswith("spp/export/")]
    assert sorted(found) == sorted(["spp/export/writer.py:2 SPPLinear (spp/adapters/methods/spp)",
                                    "spp/export/writer.py:5 SPPLinear (spp/adapters/methods/spp)",
                                    "spp/export/writer.py:5 masked_full (spp/adapters/methods/masked_full)"])
