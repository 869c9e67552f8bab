"""The project's style rule: no function in ``spp/`` is longer than 60 lines (its docstring included)."""

from __future__ import annotations

import ast

from spp.paths import REPO_ROOT

LIMIT = 60


def long_functions(root=REPO_ROOT / "spp", limit: int = LIMIT) -> list[str]:
    """``path:line name (n lines)`` of every function or method longer than ``limit`` lines under ``root``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_in_spp_is_over_60_lines():
    assert long_functions() == []


def test_the_check_sees_a_long_function(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * 61)
    (tmp_path / "ok.py").write_text("def g():\n" + "    x = 1\n" * 59)
    found = long_functions(tmp_path)
    assert len(found) == 1 and " f (62 lines)" in found[0]
