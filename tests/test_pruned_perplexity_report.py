"""The pruned-perplexity report regenerates byte for byte from its committed raw records, which name no machine
path; the report lists the rows without a record as not run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lab.pruned_perplexity.report import REPORT, report
from lab.pruned_perplexity.runs import RUNS_DIR, rows
from spp.paths import REPO_ROOT


def test_report_regenerates_byte_for_byte() -> None:
    assert report(REPO_ROOT / RUNS_DIR) == (REPO_ROOT / REPORT).read_text(encoding="utf-8")


def test_records_are_relative_and_complete() -> None:
    records = sorted((REPO_ROOT / RUNS_DIR).glob("*.json"))
    assert records and {p.stem for p in records} <= {r.label for r in rows()}
    for path in records:
        text = path.read_text(encoding="utf-8")
        assert '"/work/' not in text and '"/tmp/' not in text and '"/home/' not in text, path.name
        record = json.loads(text)
        assert len(record["perplexity"]["window_nll"]) == record["eval"]["max_windows"]


def test_a_missing_record_is_listed_as_not_run(tmp_path: Path) -> None:
    """Negative control: drop one record and the report changes, naming it under "Not run"."""
    records = sorted((REPO_ROOT / RUNS_DIR).glob("*.json"))
    for path in records[1:]:
        shutil.copy(path, tmp_path / path.name)
    text = report(tmp_path)
    assert text != report(REPO_ROOT / RUNS_DIR)
    assert records[0].stem in text.split("## Not run", 1)[1]
