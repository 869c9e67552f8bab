"""Table-2-shaped Markdown, results.json round trip through ``spp.eval.collect_results``, logger metrics."""

from __future__ import annotations

import json

import pytest

from spp.eval.collect_results import load_records
from spp.eval.collect_results import main as collect_main
from spp.eval.tables import EvalRecord, limit_notes, log_to_loggers, paper_table, ppl_text, write_results

ACCS = {"spp_boolq": 0.6, "spp_rte": 0.5, "spp_hellaswag": 0.4, "spp_winogrande": 0.55, "spp_arc_easy": 0.7,
        "spp_arc_challenge": 0.3, "spp_openbookqa": 0.25}


def _record(label: str, scale: float = 1.0) -> EvalRecord:
    tasks = {t: {"acc": a * scale, "n": 20.0} for t, a in ACCS.items()}
    tasks["spp_hellaswag"]["acc_norm"] = 0.45
    tasks["spp_mmlu"] = {"acc": 0.31}
    ppl = {"wikitext2": {"ppl": 12.345, "seqlen": 2048, "windows": 4}}
    return EvalRecord(label=label, ppl=ppl, tasks=tasks, limit=20, info={"mmlu_limit": 1})


def test_paper_table_columns_and_average():
    table = paper_table([_record("dense"), _record("half", 0.5)])
    lines = table.splitlines()
    assert lines[0] == ("| Model | wikitext2 PPL (2048×4) | BoolQ | RTE | HellaSwag | WinoGrande | ARC-e | ARC-c | "
                        "OBQA | Average | MMLU |")
    mean = sum(ACCS.values()) / 7
    accs = "60.00 | 50.00 | 40.00 | 55.00 | 70.00 | 30.00 | 25.00"
    assert lines[2] == f"| dense | 12.35 | {accs} | {100 * mean:.2f} | 31.00 |"
    assert lines[3].split(" | ")[-2] == f"{50 * mean:.2f}"
    partial = EvalRecord(label="p", tasks={"spp_rte": {"acc": 0.5}})
    assert paper_table([partial]).splitlines()[2] == "| p | – | 50.00 | – | – | – | – | – | – | – |"


def test_results_round_trip_and_collect(tmp_path):
    js, md = write_results(tmp_path / "a", [_record("dense")], meta={"x": 1})
    write_results(tmp_path / "b", [_record("half", 0.5)])
    assert json.loads(js.read_text())["records"][0]["zero_shot_mean_acc"] == pytest.approx(sum(ACCS.values()) / 7)
    assert "acc_norm" in md.read_text()
    assert "MMLU `limit` (test questions per subject, 57 subjects, sampled the same way): 1" in md.read_text()
    records = load_records([js, tmp_path / "b" / "results.json"])
    assert [r.label for r in records] == ["dense", "half"]
    out = collect_main(["--out", str(tmp_path / "t.md"), str(js), str(tmp_path / "b" / "results.json")])
    assert out.read_text().count("| dense |") == 2  # Table-2 row and acc_norm row
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_records([tmp_path / "missing.json"])


def test_metrics_reach_the_csv_logger(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(save_dir=str(tmp_path), name="csv", version="")
    log_to_loggers([logger], [_record("dense")])
    text = (tmp_path / "csv" / "metrics.csv").read_text()
    header, row = text.splitlines()[:2]
    values = dict(zip(header.split(","), row.split(","), strict=True))
    assert float(values["eval/ppl/wikitext2"]) == pytest.approx(12.345)
    assert float(values["eval/acc/zero_shot_mean"]) == pytest.approx(sum(ACCS.values()) / 7)


def test_table2_reaches_an_offline_wandb_run_and_not_the_csv_logger(tmp_path, monkeypatch):
    import wandb
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    csv_logger = CSVLogger(save_dir=str(tmp_path), name="csv", version="")
    wandb_logger = WandbLogger(save_dir=str(tmp_path), project="spp-test", offline=True)
    try:
        log_to_loggers([csv_logger, wandb_logger], [_record("dense"), _record("half", 0.5)])
    finally:
        wandb.finish()
    tables = list(tmp_path.rglob("table2*.table.json"))
    assert len(tables) == 1, "one W&B table eval/table2"
    table = json.loads(tables[0].read_text())
    assert table["columns"][:3] == ["model", "BoolQ", "RTE"] and table["columns"][-2:] == ["Average", "MMLU"]
    assert [row[0] for row in table["data"]] == ["dense", "half"]
    assert table["data"][0][1] == pytest.approx(0.6)
    assert not list((tmp_path / "csv").rglob("*table*")), "the CSV logger has no tables"
    assert "eval/1/acc/zero_shot_mean" in (tmp_path / "csv" / "metrics.csv").read_text().splitlines()[0]


def test_limit_is_described_as_the_seeded_sample_it_is():
    seeded = EvalRecord(label="s", tasks={"spp_rte": {"acc": 0.5}}, info={"doc_seed": 3})
    (line,) = limit_notes([seeded], ["20"], [])
    assert "seeded random sample" in line and 'metadata={"doc_seed": 3}' in line and "first N" not in line
    legacy = EvalRecord(label="l", tasks={"spp_rte": {"acc": 0.5}})  # made before info.doc_seed: the default, 0
    assert 'metadata={"doc_seed": 0}' in limit_notes([legacy], ["20"], [])[0]
    first = EvalRecord(label="f", tasks={"spp_rte": {"acc": 0.5}}, info={"doc_seed": None})
    assert "the first N documents" in limit_notes([first], ["20"], [])[0]  # eval.doc_seed=null


def test_an_interval_from_few_windows_carries_a_caveat():
    entry = {"ppl": 30.0, "ci_low": 25.0, "ci_high": 36.0}
    assert ppl_text({**entry, "windows": 2}) == "30.00 [25.00, 36.00] (2 windows: a rough interval)"
    assert ppl_text({**entry, "windows": 5}) == "30.00 [25.00, 36.00]"  # enough windows: no caveat
    assert ppl_text({"ppl": 30.0, "windows": 2}) == "30.00"  # no interval, nothing to qualify
