"""The pruning plan (``spp.planning``, ``benchmarks/pruning_plan.py``): the committed JSON and the table in
``docs/pruning.md`` are what the code computes, and the plan agrees with formulas written out independently."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.pruning_plan import BEGIN, DOC_PATH, END, JSON_PATH, MODELS, as_json, markdown, plan_rows, with_table
from spp.planning.hardware import GIB

# LLaMA parameter counts as published with the checkpoints (untied LM head)
KNOWN_PARAMS = {"llama7b": 6_738_415_616, "llama13b": 13_015_864_320, "llama30b": 32_528_943_616,
                "llama65b": 65_285_660_672, "llama2_70b": 68_976_648_192}
# hidden, intermediate, layers, attention heads, key-value heads (conf/model/*.yaml), vocabulary 32000
ARCHS = {"llama7b": (4096, 11008, 32, 32, 32), "llama13b": (5120, 13824, 40, 40, 40),
         "llama30b": (6656, 17920, 60, 52, 52), "llama65b": (8192, 22016, 80, 64, 64),
         "llama2_70b": (8192, 28672, 80, 64, 8)}


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    """The plan computed now, from the configs on the ``meta`` device."""
    return plan_rows()


def test_the_committed_plan_and_its_table_are_what_the_code_computes(rows):
    assert JSON_PATH.read_text() == as_json(rows), "run: python benchmarks/pruning_plan.py"
    doc, table = DOC_PATH.read_text(), markdown(rows)
    assert doc.count(BEGIN) == 1 and doc.count(END) == 1
    assert with_table(doc, table) == doc, "run: python benchmarks/pruning_plan.py"
    assert table.count("\n| `") == len(MODELS) * 2 * 2  # 5 models x {wanda, sparsegpt} x {1, 8 GPUs}


def _pruned_params(hidden: int, inter: int, layers: int, heads: int, kv_heads: int) -> int:
    """The 7 projections of every block: q, o (h x h), k, v (kv x h), gate, up, down (h x i)."""
    kv = hidden // heads * kv_heads
    return layers * (2 * hidden * hidden + 2 * kv * hidden + 3 * hidden * inter)


def test_the_plan_agrees_with_independent_formulas(rows):
    by = {(r["model"], r["pruner"], r["world"]): r for r in rows}
    assert by["llama2_70b", "sparsegpt", 1]["params"] == 68_976_648_192
    for model, (hidden, inter, layers, heads, kv_heads) in ARCHS.items():
        pruned = _pruned_params(hidden, inter, layers, heads, kv_heads)
        norms, embeddings = (2 * layers + 1) * hidden, 2 * 32000 * hidden  # RMSNorm weights; input and LM head
        assert pruned + norms + embeddings == KNOWN_PARAMS[model]
        for pruner in ("wanda", "sparsegpt"):
            one, eight = by[model, pruner, 1], by[model, pruner, 8]
            for r in (one, eight):
                assert r["params"] == KNOWN_PARAMS[model]
                assert r["host_bytes"]["weights"] == 2 * r["params"]  # bf16
                assert r["host_bytes"]["masks"] == pruned // 8  # one bit per pruned weight
                block = 2 * (pruned // layers + 2 * hidden)  # one decoder block in bf16
                assert block < r["gpu_bytes_per_device"] < r["host_bytes"]["weights"]  # a block, never the model
                assert r["gpu_fits"] and r["gpu_bytes_per_device"] <= 80 * GIB
                assert r["host_bytes"]["rank0_node"] > r["host_bytes"]["weights"] + r["host_bytes"]["masks"]
            assert eight["gpu_bytes_per_device"] < one["gpu_bytes_per_device"]
            assert eight["seconds"]["total"] < one["seconds"]["total"]
            for r in (one, eight):  # another node holds no weight: the same for every model size
                assert r["host_bytes"]["other_nodes"] == by["llama7b", pruner, r["world"]]["host_bytes"]["other_nodes"]
    assert by["llama2_70b", "wanda", 8]["host_bytes"]["masks"] == 68_451_041_280 // 8  # 80 x 855,638,016 weights


def test_true_sequential_holds_the_largest_group_of_any_family():
    """``true_sequential`` holds one sublayer group's Hessians at a time, grouped as the engine groups them
    (``spp.pruning.engine.sublayer_groups``): for GPT-2 the MLP's ``c_proj`` alone, not nothing (its projections
    have none of LLaMA's names)."""
    from spp.models.tiny import tiny_config
    from spp.planning.pruning import Calibration, gpu_bytes
    from spp.planning.shapes import shape_from_arch

    arch = tiny_config(model_type="gpt2", n_embd=512, n_inner=2048, n_head=8).to_dict()  # the block is the peak
    shape = shape_from_arch("gpt2-512", arch, ["c_attn", "c_proj", "c_fc"])
    held = {name: i * i * 8 for name, (_o, i) in shape.linears.items()}  # int64 X Xᵀ sums
    together, grouped = (gpu_bytes(shape, 1, Calibration(), True, ts) for ts in (False, True))
    assert together - grouped == sum(held.values()) - held["mlp.c_proj"] > 0
