"""The committed run plan (``benchmarks/run_plan.py``): ``docs/results/run_plan.json`` and the table in
``docs/plan.md`` are what the code computes, the 70B bound (72 GiB per 80 GB GPU) holds, and the measured-RSS table in
``docs/plan.md`` is the committed ``docs/results/plan_rss.json``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks import plan_rss
from benchmarks.run_plan import (
    BEGIN,
    DOC_PATH,
    END,
    JSON_PATH,
    MODELS,
    SETUPS,
    as_text,
    markdown,
    plan_rows,
    with_table,
)

GIB = 2**30


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    """The plan computed now, composed as ``train.py`` composes each row."""
    return plan_rows()


def test_the_committed_plan_and_its_table_are_what_the_code_computes(rows):
    assert JSON_PATH.read_text() == as_text(rows), "run: python benchmarks/run_plan.py"
    doc, table = DOC_PATH.read_text(), markdown(rows)
    assert doc.count(BEGIN) == 1 and doc.count(END) == 1
    assert with_table(doc, table) == doc, "run: python benchmarks/run_plan.py"
    assert table.count("\n| `") == len(MODELS) * len(SETUPS)  # one row per model x setup


def test_70b_on_8_gpus_with_fsdp2_fits_72_gib_per_gpu_and_1_5_x_the_model_per_node(rows):
    row = next(r for r in rows if r["model"] == "llama2_70b" and r["setup"] == "8 GPUs FSDP2")
    assert row["problems"] == []
    for phase in row["phases"]:
        assert phase["device_bytes"] <= 72 * GIB, phase["name"]
        assert phase["host_rank0_node_bytes"] <= 1.5 * row["weight_bytes"], phase["name"]
    assert row["weight_bytes"] == 2 * 68_976_648_192  # bf16
    assert (row["eval_placement"]["replicas"], row["eval_placement"]["gpus_per_replica"]) == (2, 4)


def test_every_sharded_row_fits_and_what_does_not_fit_one_gpu_is_named(rows):
    for row in rows:
        if row["setup"] != "1 GPU" and not (row["setup"] == "8 GPUs ZeRO-3" and row["model"] in ("llama65b",
                                                                                                 "llama2_70b")):
            assert row["problems"] == [], (row["model"], row["setup"], row["problems"])
    for model in ("llama65b", "llama2_70b"):  # DeepSpeed places the whole model on every GPU before partitioning
        zero3 = next(r for r in rows if r["model"] == model and r["setup"] == "8 GPUs ZeRO-3")
        assert [p["phase"] for p in zero3["problems"]][0] == "place"  # (65B: evaluate too, beside the engine)
        assert zero3["problems"][0]["fix"].startswith("set strategy=fsdp")
    one = {r["model"]: r for r in rows if r["setup"] == "1 GPU"}
    assert [m for m, r in one.items() if r["problems"]] == ["llama30b", "llama65b", "llama2_70b"]
    assert one["llama2_70b"]["problems"][0]["fix"].startswith("set strategy=fsdp trainer.devices=2")


def test_the_measured_rss_table_is_the_committed_measurement():
    data = json.loads(plan_rss.JSON_PATH.read_text())
    doc = DOC_PATH.read_text()
    _head, rest = doc.split(plan_rss.BEGIN, 1)
    assert rest.split(plan_rss.END, 1)[0] == plan_rss.markdown(data), "run: python benchmarks/plan_rss.py"
    for case in data["cases"]:
        assert case["exit"] == 0
        for rank in case["ranks"].values():
            assert 0.75 <= rank["ratio"] <= 1.25, (case["case"], rank)
