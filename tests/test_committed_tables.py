"""Every committed paper table under experiments/results/ is exactly what the collector produces from
the committed raw runs (title and command line are read from the table itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.collect_summaries import collect

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results"
COMMITTED = {
    "table2_zeroshot_smollm2_135m.md": ("table2", "runs/table2_zeroshot"),
    "table3_75pct_smollm2_135m.md": ("table3", "runs/table3_75pct"),
    "table4_lora_star_smollm2_135m.md": ("table4", "runs/table4_lora_star"),
    "table5_mmlu_smollm2_135m.md": ("table5", "runs/table5_mmlu"),
    "table6_ablations_smollm2_135m.md": ("table6", "runs/table6_ablations"),
}
"""Committed table -> (collector table id, raw runs directory). Regenerate one with
``python -m lab.collect_summaries <id> experiments/results/<runs> --title "<line 1>" --command "<line 3>"
--out experiments/results/<table>``."""


def test_every_committed_collector_table_is_listed():
    made_by_collector = {p.name for p in RESULTS.glob("table*_*.md") if not p.name.startswith("table1_")}
    assert made_by_collector == set(COMMITTED)


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_committed_table_regenerates_byte_identically(name: str):
    table, runs = COMMITTED[name]
    text = (RESULTS / name).read_text(encoding="utf-8")
    lines = text.split("\n")
    assert lines[0].startswith("# ") and lines[2].startswith("Command: `") and lines[2].endswith("`")
    title, command = lines[0][2:], lines[2][len("Command: `"):-1]
    assert collect(table, [RESULTS / runs], title=title, command=command) == text, (
        f"{name} differs from the collector's output over {runs}; regenerate it (see COMMITTED's docstring)")


CAMPAIGN = RESULTS / "runs" / "methods_one_epoch"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("methods_one_epoch_lr_select_*.md")), ids=lambda p: p.name)
def test_committed_lr_grid_regenerates_byte_identically(path: Path):
    """``python -m lab.lr_select runs/methods_one_epoch/lr_select/<method> --out <file>`` wrote it."""
    from lab.lr_select import grid_table, load_grid

    method = path.stem.removeprefix("methods_one_epoch_lr_select_")
    assert grid_table(load_grid(CAMPAIGN / "lr_select" / method)) == path.read_text(encoding="utf-8"), (
        f"{path.name} differs from the grid runs; regenerate it (experiments/README.md, campaign section)")


@pytest.mark.parametrize("path", sorted(RESULTS.glob("methods_one_epoch_smollm2_135m.md")), ids=lambda p: p.name)
def test_committed_campaign_table_regenerates_byte_identically(path: Path):
    """``python -m lab.methods_one_epoch runs/methods_one_epoch --title ... --command ... --out <file>`` wrote it."""
    from lab.methods_one_epoch import collect_campaign

    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[0].startswith("# ") and lines[2].startswith("Command: `") and lines[2].endswith("`")
    title, command = lines[0][2:], lines[2][len("Command: `"):-1]
    assert collect_campaign([CAMPAIGN], title=title, command=command) == path.read_text(encoding="utf-8"), (
        f"{path.name} differs from the collector's output over runs/methods_one_epoch; regenerate it")
