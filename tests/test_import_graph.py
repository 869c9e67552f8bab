"""No import cycles inside ``spp``: every ``import`` statement of every module under ``spp/`` (module level and
inside functions alike) is read with ``ast``; the graph between subpackages (``spp.training``, ``spp.eval``,
``spp.pruning``, ``spp.adapters``, ``spp.models``, ``spp.data``, ... and top-level modules such as ``spp.atomic``)
must be acyclic, and so must the graph between modules; no module inside ``spp`` imports the ``spp`` package
itself (``import spp`` / ``from spp import ...``); the layering rules of :data:`LAYERING` hold; an ``spp`` import
inside a function says on its line why it is not at the top."""

from __future__ import annotations

import ast
import io
import tokenize
from collections import defaultdict
from pathlib import Path

import pytest

from spp.paths import REPO_ROOT

PACKAGE = "spp"
ROOT = REPO_ROOT / PACKAGE

Edges = dict[str, dict[str, list[str]]]
"""``{source: {target: ["path:line", ...]}}``."""


def module_name(path: Path) -> str:
    """``spp/eval/runner.py`` → ``spp.eval.runner``; ``spp/eval/__init__.py`` → ``spp.eval``."""
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_in(text: str, name: str, is_package: bool = False) -> list[tuple[str, int]]:
    """Every ``spp`` module the source ``text`` of module ``name`` imports, at any nesting level (functions,
    ``if`` blocks, ``try``), as ``(module, line)``; relative imports are resolved against ``name``.

    ``from a.b import c`` counts as ``a.b.c`` when ``c`` is a module, else as ``a.b``.
    """
    package = name if is_package else name.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub if sub in MODULES else base, node.lineno))
    return [(m, line) for m, line in out if m == PACKAGE or m.startswith(PACKAGE + ".")]


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """:func:`imports_in` of a file under ``spp/``."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def subpackage(module: str) -> str:
    """``spp.eval.runner`` → ``spp.eval``; ``spp.atomic`` → ``spp.atomic``; ``spp`` → ``spp``."""
    return ".".join(module.split(".")[:2])


def graph(level) -> Edges:
    """The import graph with each module mapped by ``level`` (self edges dropped), with the evidence of each edge."""
    edges: Edges = defaultdict(lambda: defaultdict(list))
    for name, path in MODULES.items():
        for target, line in imported_modules(path):
            a, b = level(name), level(target)
            where = f"{path.relative_to(REPO_ROOT)}:{line}"
            if a != b and where not in edges[a][b]:
                edges[a][b].append(where)
    return edges


def cycles(edges: Edges) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def describe(edges: Edges, components: list[list[str]]) -> str:
    """Every edge inside each cycle, with the file and line that makes it."""
    lines = []
    for component in components:
        lines.append("cycle between " + ", ".join(component) + ":")
        for a in component:
            for b in component:
                if b in edges.get(a, {}):
                    lines.append(f"  {a} -> {b}: {', '.join(edges[a][b])}")
    return "\n".join(lines)


def test_walker_sees_nested_and_relative_imports() -> None:
    text = (
        "import os\nimport spp\nfrom spp.eval import tables\n\n"
        "def f():\n    if True:\n        from spp.training.config import X\n"
        "class C:\n    def g(self):\n        from .perplexity import perplexity\n        from .. import atomic\n"
    )
    found = imports_in(text, "spp.eval.runner")
    assert found == [("spp", 2), ("spp.eval.tables", 3), ("spp.training.config", 7), ("spp.eval.perplexity", 10),
                     ("spp.atomic", 11)]
    assert imports_in("from . import tables\n", "spp.eval", is_package=True) == [("spp.eval.tables", 1)]
    assert subpackage("spp.training.config") == "spp.training" and subpackage("spp.atomic") == "spp.atomic"
    assert module_name(ROOT / "eval" / "__init__.py") == "spp.eval"
    found = cycles({"a": {"b": ["x:1"]}, "b": {"c": ["x:2"]}, "c": {"a": ["x:3"]}, "d": {"a": ["x:4"]}})
    assert found == [["a", "b", "c"]]


def test_no_module_imports_the_spp_package_itself() -> None:
    offenders = [
        f"{path.relative_to(REPO_ROOT)}:{line}"
        for name, path in MODULES.items()
        if name != PACKAGE
        for target, line in imported_modules(path)
        if target == PACKAGE
    ]
    assert offenders == [], f"inside spp use `from spp.<module> import <name>`, not `import spp`: {offenders}"


@pytest.mark.parametrize("level", [subpackage, lambda m: m], ids=["subpackages", "modules"])
def test_import_graph_is_acyclic(level) -> None:
    edges = graph(level)
    found = cycles(edges)
    assert found == [], "import cycles inside spp (function-local imports included):\n" + describe(edges, found)


def test_the_package_never_imports_the_lab() -> None:
    """``lab/`` (studies, paper tables, benchmark helpers) builds on ``spp``; nothing in ``spp`` imports it."""
    found = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(REPO_ROOT)}:{node.lineno}" for t in targets if t.split(".")[0] == "lab"]
    assert not found, f"spp imports the lab at {found}"
    assert (REPO_ROOT / "lab" / "__init__.py").is_file() and not (ROOT / "experiments").exists()


LAYERING: list[tuple[str, str, str]] = [
    ("spp.pruning.masks", "spp.adapters", "masks are pruning's: the packed format is spp.bitmask, below both"),
    ("spp.eval.offloaded", "spp.pruning", "running blocks one at a time is spp.models.block_runner's, not pruning's"),
    ("spp.export", "spp.adapters.methods", "export reads any method through spp.adapters.base, never one method"),
    ("spp.models", "spp.pruning", "models sit below pruning"),
    ("spp.planning", "spp.adapters.methods", "the planner asks a method through the adapter registry"),
    ("spp.planning", "spp.pruning.pruners", "the planner asks a pruner through the pruner registry"),
    ("spp.planning", "spp.training", "plans are plain values (spp.planning.spec); the training phases read them"),
    ("spp.adapters.base", "spp.adapters.methods", "the interface knows no method"),
    ("spp.pruning.base", "spp.pruning.pruners", "the interface knows no pruner"),
]
"""``(importer prefix, forbidden target prefix, why)``: imports that would put a module in the wrong layer."""


def layering_violations(modules: dict[str, Path]) -> list[str]:
    """Every import of ``modules`` that :data:`LAYERING` forbids, as ``path:line importer -> target (why)``."""
    out = []
    for name, path in modules.items():
        for target, line in imports_in(path.read_text(), name, path.name == "__init__.py"):
            for src, dst, why in LAYERING:
                if (name == src or name.startswith(src + ".")) and (target == dst or target.startswith(dst + ".")):
                    out.append(f"{path.name}:{line} {name} -> {target} ({why})")
    return out


def test_layering_rules_hold() -> None:
    assert layering_violations(MODULES) == []


@pytest.mark.parametrize(("module", "line"), [
    ("spp.pruning.masks", "from spp.adapters.bitmask import pack_rows"),
    ("spp.eval.offloaded", "from spp.pruning.sequential import BlockRunner"),
    ("spp.export.semi_structured", "from spp.adapters.methods.spp.layer import SPPLinear"),
])
def test_layering_rules_catch_a_violation(tmp_path: Path, module: str, line: str) -> None:
    """Negative control: each import the layering forbids (masks -> the adapters' bitmask, the offloaded perplexity
    -> pruning's block runner, the 2:4 export -> SPP's layer class) is reported when a copy of the module makes it."""
    real = MODULES[module]
    fake = tmp_path / real.name
    fake.write_text(real.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")
    target = line.split()[1]
    assert layering_violations({module: real}) == []
    found = [v for v in layering_violations({module: fake}) if target in v]
    assert len(found) == 1, found


def uncommented_local_imports(text: str, name: str) -> list[int]:
    """Lines of ``spp`` imports inside a function body of source ``text`` (module ``name``) that carry no ``#``
    comment saying why they are not at the top (optional dependency, start-up time, the cycle). A run of
    consecutive import statements shares the comment of its first line."""
    comments = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                if tok.type == tokenize.COMMENT}
    tree = ast.parse(text)
    out: list[int] = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for body in [getattr(n, "body", None) for n in ast.walk(func)] + [getattr(n, "orelse", None)
                                                                        for n in ast.walk(func)]:
            if not isinstance(body, list):
                continue
            covered = False  # the previous statement was a commented import
            for stmt in body:
                if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    covered = False
                    continue
                lines = set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
                covered = covered or bool(lines & comments)
                mod = ast.Module(body=[stmt], type_ignores=[])
                if imports_in(ast.unparse(mod), name) and not covered:
                    out.append(stmt.lineno)
    return sorted(set(out))


def test_function_local_spp_imports_say_why() -> None:
    """An ``spp`` import inside a function is hoisted to the module's top unless a comment on it says why."""
    found = [f"{path.relative_to(REPO_ROOT)}:{line}" for name, path in MODULES.items()
             for line in uncommented_local_imports(path.read_text(encoding="utf-8"), name)]
    assert found == [], f"move these imports to the top of their module, or say why on the line: {found}"


def test_function_local_import_rule_catches_a_bare_import() -> None:
    """Negative control: an uncommented local import is caught, a commented one and its run are not."""
    text = ("import os\n\ndef f():\n    from spp.atomic import write_file_atomic\n    return 1\n\n"
            "def g():\n    from spp.errors import UserError  # start-up time\n    from spp.paths import REPO_ROOT\n"
            "    import json\n    return json\n\nclass C:\n    def h(self):\n        if os:\n"
            "            import spp.bitmask\n")
    assert uncommented_local_imports(text, "spp.x") == [4, 16]
