"""Per-document zero-shot records (``eval.log_samples=true``), the majority-class row, and the paired
comparison of two models' accuracies (spp/eval/paired.py) against independent formulas."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from spp.eval.doc_records import DOC_RECORDS_FILE, majority_class, read_doc_records, write_doc_records
from spp.eval.job_config import register_eval_schema
from spp.eval.paired import MEAN_ROW, main, paired_accuracy
from spp.eval.runner import run_eval_job
from spp.paths import CONF_DIR, SAMPLE_DATA_DIR

Z95, Z80 = 1.959963984540054, 0.8416212335729143  # standard normal quantiles 0.975 and 0.80


def _records(task: str, correct: np.ndarray, gold: np.ndarray | None = None) -> list[dict]:
    gold = np.zeros(len(correct), dtype=int) if gold is None else gold
    return [{"task": task, "doc_id": i, "doc_hash": f"h{i}", "gold": int(g), "acc": float(c)}
            for i, (c, g) in enumerate(zip(correct, gold, strict=True))]


def test_paired_difference_matches_the_discordant_pair_formula():
    rng = np.random.default_rng(0)
    n = 200
    a = rng.random(n) < 0.55
    b = np.where(rng.random(n) < 0.8, a, rng.random(n) < 0.45)  # agrees with a on most documents
    b2 = np.where(rng.random(300) < 0.7, rng.random(300) < 0.6, rng.random(300) < 0.4)
    a2 = np.where(rng.random(300) < 0.7, b2, rng.random(300) < 0.6)
    rows = {r.task: r for r in paired_accuracy(_records("t1", a) + _records("t2", a2),
                                               _records("t1", b) + _records("t2", b2))}
    for task, (xa, xb) in {"t1": (a, b), "t2": (a2, b2)}.items():
        m = len(xa)
        n10, n01 = int(np.sum(xa & ~xb)), int(np.sum(~xa & xb))  # discordant pairs (McNemar's b and c)
        diff = (n10 - n01) / m
        var = ((n10 + n01) / m - diff ** 2) * m / (m - 1)  # sample variance of d in {-1, 0, 1}
        se = math.sqrt(var / m)
        row = rows[task]
        assert (row.n, row.a_only, row.b_only) == (m, n10, n01)
        assert row.diff == pytest.approx(xa.mean() - xb.mean()) == pytest.approx(diff)
        assert row.se == pytest.approx(se) and row.low == pytest.approx(diff - Z95 * se)
        assert row.mdd == pytest.approx((Z95 + Z80) * se)  # δ = (z_α/2 + z_β) σ_d / √n
        unpaired = math.sqrt(xa.mean() * (1 - xa.mean()) / (m - 1) + xb.mean() * (1 - xb.mean()) / (m - 1))
        assert row.se < 0.8 * unpaired, "pairing removes the shared per-document variance"
    mean = rows[MEAN_ROW]
    assert mean.diff == pytest.approx((rows["t1"].diff + rows["t2"].diff) / 2)
    assert mean.se == pytest.approx(math.hypot(rows["t1"].se, rows["t2"].se) / 2)


def test_paired_refuses_different_documents_and_reports_majority_class():
    a = _records("t", np.array([1, 0, 1, 1]), gold=np.array([1, 1, 0, 1]))
    b = [dict(r) for r in a]
    b[2]["doc_hash"] = "other"
    with pytest.raises(ValueError, match="document 2 differs"):
        paired_accuracy(a, b)
    assert majority_class(a) == {"t": {"acc": 0.75, "label": 1.0, "n": 4.0}}


def test_eval_job_writes_per_document_records(tmp_path, capsys):
    """eval.py on a tiny model, two shipped task samples, 3 documents each: lm-eval's own per-document results."""
    register_eval_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="evaluate", overrides=[
            "model=tiny", "eval.ppl=false", f"data_dir={SAMPLE_DATA_DIR}", "print_config=false", "logger=csv",
            "eval.tasks=[spp_arc_easy,spp_winogrande]", "eval.limit=3", "eval.log_samples=true"]))
    record = run_eval_job(cfg, tmp_path)
    docs = read_doc_records(tmp_path / DOC_RECORDS_FILE)
    assert len(docs) == 6 and record.info["documents"] == DOC_RECORDS_FILE
    for task in ("spp_arc_easy", "spp_winogrande"):
        rows = [r for r in docs if r["task"] == task]
        for name in ("acc", "acc_norm") if task == "spp_arc_easy" else ("acc",):
            assert sum(r[name] for r in rows) / 3 == pytest.approx(record.tasks[task][name]), (task, name)
        for r in rows:  # gold is the right index: acc == (the most likely choice is gold)
            assert r["acc"] == float(int(np.argmax(r["loglikelihoods"])) == r["gold"]), r
        assert len(rows[0]["loglikelihoods"]) == (4 if task == "spp_arc_easy" else 2)
    payload = json.loads((tmp_path / "results.json").read_text())
    majority = payload["records"][0]["info"]["majority_class"]
    assert set(majority) == {"spp_arc_easy", "spp_winogrande"} and majority["spp_winogrande"]["n"] == 3
    assert "| majority class (scored documents) |" in (tmp_path / "results.md").read_text()
    write_doc_records(tmp_path / "b.jsonl", [{**r, "acc": 1.0} for r in docs])
    assert main([str(tmp_path), str(tmp_path / "b.jsonl")]) == 0
    assert f"| {MEAN_ROW} | 6 |" in capsys.readouterr().out
