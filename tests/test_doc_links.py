"""Every relative link of the README, ``docs/`` and the results READMEs points at a file or folder of the
repository, and every ``#anchor`` at a heading of its target; the README's first screen keeps the commands that
``.ci/run`` extracts and the markers the supported-models table is generated between."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import pytest

from spp.paths import REPO_ROOT

DOCS = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "experiments" / "results").glob("**/README.md"),
               *(REPO_ROOT / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def links(text: str) -> list[str]:
    """The link and image targets of a markdown text, outside code blocks and inline code."""
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))
    return [a or b for a, b in LINK.findall(text)]


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file: lower case, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    heads = [h.strip() for h in re.findall(r"^#{1,6} (.+)$", text, re.M)]
    return {re.sub(r"[^\w\- ]", "", re.sub(r"[`*]", "", h).lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(doc: Path):
    broken = []
    for target in links(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        where, _, anchor = target.partition("#")
        path = (doc.parent / where).resolve() if where else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO_ROOT)}: broken links {broken}"


def test_the_readme_first_screen_keeps_the_ci_commands_and_the_table_markers():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    for marker, tail in (("<!-- main-command -->", "&& python train.py"), ("<!-- test-command -->", "&& pytest")):
        i = lines.index(marker)  # .ci/run: awk '/<!-- test-command -->/{getline; getline; print; exit}'
        assert lines[i + 1] == "```bash" and lines[i + 2].startswith("pip install torch==2.13.0 && ")
        assert lines[i + 2].endswith(tail)
        assert i < 40, f"{marker} is not on the first screen"
    assert text.count("<!-- supported-models:begin -->") == 1 and text.count("<!-- supported-models:end -->") == 1
    table = text.split("<!-- supported-models:begin -->")[1].split("<!-- supported-models:end -->")[0]
    assert table.strip().startswith("| family | stands for | pruners | adapters")
    assert "## Supported models" in text.split("<!-- supported-models:begin -->")[0]


DOTTED = re.compile(r"`+:?(?:func:|class:|mod:|meth:|attr:)?`*(spp(?:\.[A-Za-z_]\w*)+)(?![\w.-])")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module of spp or an attribute reached from one (``spp.a.b.name``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name and ".".join(parts[:cut]).startswith(err.name):
                continue
            raise
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_spp_name_quoted_in_docs_and_code_exists():
    """A module or function quoted as ``spp.x.y`` in a Markdown file, a docstring or a comment still exists there
    (names go stale when code moves: ``spp.adapters.lora_star.merge_and_remask`` did)."""
    files = subprocess.run(["git", "ls-files", "*.md", "*.py", "*.yaml"], cwd=REPO_ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    quoted: dict[str, str] = {}
    for rel in (f for f in files if f != "tests/test_doc_links.py"):  # this file quotes made-up names
        for name in DOTTED.findall((REPO_ROOT / rel).read_text(encoding="utf-8")):
            quoted.setdefault(name, rel)
    assert len(quoted) > 100
    assert not resolves("spp.adapters.lora_star.merge_and_remask") and resolves("spp.pruning.job.prune_job")
    stale = {name: rel for name, rel in quoted.items() if not resolves(name)}
    assert not stale, f"names that no longer exist (where first quoted): {stale}"
