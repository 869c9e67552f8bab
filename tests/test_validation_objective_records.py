"""One tiny train.py run: the merged model's WikiText-2 validation perplexity as the sweep objective,
per-document zero-shot records beside summary.json, and data files recorded relative to their root with sha256."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from train_helpers import tiny_job
from transformers import AutoModelForCausalLM, AutoTokenizer

from spp.commands.train import run
from spp.eval.doc_records import DOC_RECORDS_FILE, read_doc_records
from spp.eval.perplexity import perplexity
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR, file_sha256

ROWS = 400  # WikiText-2 rows kept in the run's data copy: two 128-token windows and quick tokenisation


def _data_dir(tmp: Path) -> Path:
    """A data root outside the repository: the shipped Alpaca, C4 and RTE samples, WikiText-2 cut to :data:`ROWS`."""
    root = tmp / "data"
    for rel in ("alpaca/cleaned_partial", "c4", "rte"):
        shutil.copytree(SAMPLE_DATA_DIR / rel, root / rel)
    for split in ("test", "validation"):
        lines = (SAMPLE_DATA_DIR / f"wikitext2/{split}.json").read_text().splitlines()[:ROWS]
        (root / "wikitext2").mkdir(parents=True, exist_ok=True)
        (root / f"wikitext2/{split}.json").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run (1 step) selecting on ``ppl_val_merged``, with RTE on 3 documents and log_samples."""
    tmp = tmp_path_factory.mktemp("i33")
    data = _data_dir(tmp)
    job = tiny_job(tmp, "trainer.max_steps=1", "trainer.limit_val_batches=1", "trainer.val_check_interval=1",
                   "sample.enabled=false", "dense_ppl=false", "eval.extra_ppl_sources=[wikitext2_val]",
                   "sweep_objective=ppl_val_merged", "eval.tasks=[spp_rte]", "eval.limit=3", "eval.log_samples=true",
                   "export.merged=true", f"data_dir={data}")
    value = run(job)
    return tmp, data, value, json.loads((tmp / "run" / "summary.json").read_text())


def test_sweep_objective_is_the_merged_models_validation_perplexity(tiny_run):
    tmp, data, value, summary = tiny_run
    val = summary["merged_ppl_by_source"]["wikitext2_val"]
    assert value == val["ppl"] and val["source"] == "wikitext2_val" and val["windows"] == 2
    assert summary["merged_ppl_by_source"]["wikitext2"]["ppl"] == summary["perplexity"]["merged"]["ppl"] != value
    merged = tmp / "run" / "merged"  # recomputed from the exported (merged) model, on the validation split
    again = perplexity(AutoModelForCausalLM.from_pretrained(merged), AutoTokenizer.from_pretrained(merged),
                       source=str(data / "wikitext2/validation.json"), seqlen=128, max_windows=2)
    assert again.ppl == pytest.approx(value, rel=1e-5)
    assert summary["losses"]["val"], "the Alpaca validation loss is still reported"


def test_zero_shot_documents_are_written_beside_the_summary(tiny_run):
    tmp, _data, _value, summary = tiny_run
    records = read_doc_records(tmp / "run")
    assert summary["zero_shot"]["documents"] == DOC_RECORDS_FILE and len(records) == 3
    assert sum(r["acc"] for r in records) / 3 == pytest.approx(summary["zero_shot"]["metrics"]["spp_rte"]["acc"])
    golds = [r["gold"] for r in records]
    top = max(set(golds), key=golds.count)
    assert summary["zero_shot"]["majority_class"]["spp_rte"]["acc"] == pytest.approx(golds.count(top) / 3)


def test_run_records_hold_data_files_relative_to_their_root(tiny_run):
    tmp, data, _value, summary = tiny_run
    files = {f["path"]: f for f in summary["data_files"]}
    assert {"wikitext2/test.json", "wikitext2/validation.json", "rte/val.jsonl", "c4/c4_sample.jsonl"} <= set(files)
    for rel, row in files.items():
        assert row["root"] == "data_root" and not Path(rel).is_absolute()
        assert row["sha256"] == file_sha256(data / rel)
    assert files["rte/val.jsonl"]["shipped_sample"], "the bytes of the shipped sample, read from another root"
    assert not files["wikitext2/test.json"]["shipped_sample"], "cut: not the shipped file any more"
    text = json.dumps(summary["data_files"])
    assert str(tmp) not in text and str(REPO_ROOT) not in text and not re.search(r'"/', text)


def test_ppl_val_merged_needs_the_validation_source(tmp_path):
    with pytest.raises(Exception, match=r"ppl_val_merged needs .*eval.extra_ppl_sources=\[wikitext2_val\]"):
        tiny_job(tmp_path, "sweep_objective=ppl_val_merged")
    with pytest.raises(Exception, match=r"ppl_val_merged needs"):
        tiny_job(tmp_path, "sweep_objective=ppl_val_merged", "eval.extra_ppl_sources=[wikitext2_val]", "eval.ppl=false")
    assert tiny_job(tmp_path, "sweep_objective=ppl_val_merged", "eval.ppl_source=wikitext2_val").eval.ppl
