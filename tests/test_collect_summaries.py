"""``lab.collect_summaries``: synthetic ``summary.json`` files → the exact paper-shaped Markdown tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lab import collect_summaries as collect

TASKS = ("spp_boolq", "spp_rte", "spp_hellaswag", "spp_winogrande", "spp_arc_easy", "spp_arc_challenge",
         "spp_openbookqa")


SPARSITY = {
    "dense": {"name": "dense", "kind": "dense", "ratio": None, "n": None, "m": None},
    "unstructured50": {"name": "unstructured50", "kind": "unstructured", "ratio": 0.5, "n": None, "m": None},
    "unstructured75": {"name": "unstructured75", "kind": "unstructured", "ratio": 0.75, "n": None, "m": None},
    "nm2_4": {"name": "nm2_4", "kind": "nm", "ratio": None, "n": 2, "m": 4},
    "nm2_8": {"name": "nm2_8", "kind": "nm", "ratio": None, "n": 2, "m": 8},
}


def summary(
    *,
    model: str = "m",
    pruner: str = "wanda",
    sparsity: str = "nm2_4",
    adapter: str = "spp",
    r: int = 16,
    seed: int = 0,
    ppl: float | None = 20.0,
    ppl_pruned: float | None = 40.0,
    accs: tuple[float, ...] | None = None,
    mmlu: float | None = None,
    removed: float | None = None,
    total: int = 1000,
    trainable: int = 10,
    train_last: float | None = 2.5,
    lr: float = 0.004,
    **adapter_fields: Any,
) -> dict[str, Any]:
    """A ``summary.json`` with only the fields ``collect_summaries.py`` reads (same layout as ``train.py`` writes)."""
    ad = {"name": adapter, "r": r, "use_beta": True, "alpha_init": "kaiming", "beta_init": "zeros",
          "residual": True, **adapter_fields}
    metrics = {t: {"acc": a, "acc_norm": a} for t, a in zip(TASKS, accs or (), strict=False)}
    if mmlu is not None:
        metrics["spp_mmlu"] = {"acc": mmlu}
    pr = {"name": pruner, **({"initial_method": "wanda"} if pruner == "dsnot" else {})}
    return {
        "run": {"model": model, "pruner": pruner, "sparsity": sparsity, "adapter": adapter, "r": r},
        "perplexity": {"dense": {"ppl": 10.0}, "pruned": {"ppl": ppl_pruned} if ppl_pruned else None,
                       "merged": {"ppl": ppl} if ppl else None},
        "zero_shot": {"metrics": metrics} if metrics else None,
        "params": {"trainable": trainable, "frozen": total, "total": total + trainable},
        "losses": {"train_last": train_last, "optimizer_steps": 12 if adapter != "none" else 0},
        "merge": {"removed_fraction": removed} if removed is not None else {},
        "config": {
            "model": {"name": model}, "pruner": pr, "sparsity": SPARSITY[sparsity], "adapter": ad, "seed": seed,
            "data": {"max_examples": 120, "max_length": 128, "train_batch_size": 4},
            "trainer": {"lr": lr},
            "calibration": {"source": "c4", "nsamples": 32, "seqlen": 512},
            "eval": {"ppl_source": "wikitext2", "seqlen": 512, "max_windows": 4, "tasks": ["spp_zeroshot"],
                     "limit": 20},
        },
    }


def write_runs(root: Path, runs: list[dict[str, Any]]) -> Path:
    for i, run in enumerate(runs):
        d = root / f"{i}_job"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(run))
    return root


def table_lines(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith("|")]


def test_table2_rows_order_labels_and_seed_mean(tmp_path):
    accs_a = (0.7, 0.5, 0.4, 0.6, 0.6, 0.3, 0.2)  # mean 0.4714...
    accs_b = (0.8, 0.6, 0.5, 0.6, 0.7, 0.4, 0.3)  # mean 0.5571...
    runs = [
        summary(pruner="wanda", sparsity="nm2_4", adapter="spp", seed=1, ppl=22.0, accs=accs_b),
        summary(pruner="wanda", sparsity="nm2_4", adapter="spp", seed=0, ppl=20.0, accs=accs_a),
        summary(pruner="wanda", sparsity="nm2_4", adapter="none", ppl=40.0, accs=accs_a),
        summary(pruner="none", sparsity="dense", adapter="none", ppl=10.0, accs=accs_b),
        summary(pruner="sparsegpt", sparsity="unstructured50", adapter="none", ppl=15.5),
        summary(pruner="wanda", sparsity="unstructured50", adapter="none", ppl=16.25),
    ]
    report = collect.collect("table2", [write_runs(tmp_path, runs)], command="bash run.sh")
    assert report.startswith("# Table 2/8: zero-shot accuracy (%), pruned vs pruned+SPP\n\nCommand: `bash run.sh`\n")
    dash = " | ".join(["–"] * 8)
    assert table_lines(report) == [
        "| Model | Method | Sparsity | BoolQ | RTE | HellaSwag | WinoGrande | ARC-e | ARC-c | OBQA | Average | PPL "
        "| Gap closed (%) | Seeds |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| m | None | Dense | 80.00 | 60.00 | 50.00 | 60.00 | 70.00 | 40.00 | 30.00 | 55.71 | 10.00 | – | 0 |",
        f"| m | SparseGPT | Unstructured 50% | {dash} | 15.50 | – | 0 |",
        f"| m | Wanda | Unstructured 50% | {dash} | 16.25 | – | 0 |",
        "| m | Wanda | 2:4 | 70.00 | 50.00 | 40.00 | 60.00 | 60.00 | 30.00 | 20.00 | 47.14 | 40.00 | – | 0 |",
        # gap closed (log 40 - log 20) / (log 40 - log 10) = 50 %, (log 40 - log 22) / log 4 = 43.1 %
        "| m | Wanda+SPP | 2:4 | 75.00 ± 7.07 | 55.00 ± 7.07 | 45.00 ± 7.07 | 60.00 ± 0.00 | 65.00 ± 7.07 | "
        "35.00 ± 7.07 | 25.00 ± 7.07 | 51.43 ± 6.06 | 21.00 ± 1.41 | 46.6 ± 4.9 | 0,1 |",
    ]
    assert "- train 120 Alpaca records ≤ 128 tokens, batch 4, 12 optimizer steps, lr 0.004;" in report
    assert "- no training; calibration c4 32×512; PPL wikitext2 first 4 windows × 512" in report


def test_table3_groups_by_sparsity_then_method(tmp_path):
    accs = (0.5,) * 7
    runs = [
        summary(pruner="wanda", sparsity="nm2_8", adapter="spp", ppl=80.0, accs=accs),
        summary(pruner="dsnot", sparsity="unstructured75", adapter="none", ppl=900.0, accs=accs),
        summary(pruner="wanda", sparsity="unstructured75", adapter="spp", ppl=60.0, accs=accs),
        summary(pruner="wanda", sparsity="unstructured75", adapter="none", ppl=1200.0, accs=(0.25,) * 7),
    ]
    lines = table_lines(collect.collect("table3", [write_runs(tmp_path, runs)]))
    assert lines[2:] == [
        "| m | Wanda | Unstructured 75% | 25.00 | 1200.00 | – | 0 |",
        "| m | Wanda+DS⊘T | Unstructured 75% | 50.00 | 900.00 | – | 0 |",
        "| m | Wanda+SPP | Unstructured 75% | 50.00 | 60.00 | -29.2 | 0 |",  # log(40/60) / log(40/10)
        "| m | Wanda+SPP | 2:8 | 50.00 | 80.00 | -50.0 | 0 |",
    ]


def test_table4_reports_share_of_lora_update_removed(tmp_path):
    runs = [
        summary(sparsity="unstructured75", adapter="spp", ppl=60.0, trainable=1234, lr=0.02),
        summary(sparsity="unstructured75", adapter="lora", r=8, ppl=70.0, removed=0.7512, trainable=56789, lr=0.02,
                train_last=8.5),
        summary(sparsity="unstructured75", adapter="lora", r=8, ppl=65.0, removed=0.75, trainable=56789, lr=0.002),
    ]
    lines = table_lines(collect.collect("table4", [write_runs(tmp_path, runs)]))
    tail = "| Average | PPL | Gap closed (%) | Train loss (last) | Trainable | Update removed by re-mask (%) | Seeds |"
    assert lines[0].endswith(tail)
    dash = " | ".join(["–"] * 8)
    assert lines[2:] == [  # a LoRA* learning rate is its own row, not a second seed of the other
        f"| m | Wanda+LoRA* | Unstructured 75% | 8 | 0.02 | {dash} | 70.00 | -40.4 | 8.500 | 56,789 | 75.12 | 0 |",
        f"| m | Wanda+LoRA* | Unstructured 75% | 8 | 0.002 | {dash} | 65.00 | -35.0 | 2.500 | 56,789 | 75.00 | 0 |",
        f"| m | Wanda+SPP | Unstructured 75% | 16 | 0.02 | {dash} | 60.00 | -29.2 | 2.500 | 1,234 | "
        "0 (by construction)"
        " | 0 |",
    ]


def test_table5_one_column_per_model_smallest_first(tmp_path):
    runs = [
        summary(model="big", pruner="wanda", sparsity="nm2_4", adapter="spp", mmlu=0.30, total=9000),
        summary(model="big", pruner="wanda", sparsity="nm2_4", adapter="none", mmlu=0.25, total=9000),
        summary(model="small", pruner="wanda", sparsity="nm2_4", adapter="spp", mmlu=0.27, total=100),
        summary(model="small", pruner="none", sparsity="dense", adapter="none", mmlu=0.29, total=100),
    ]
    lines = table_lines(collect.collect("table5", [write_runs(tmp_path, runs)]))
    assert lines == [
        "| Method | Sparsity | small | big |",
        "|---|---|---:|---:|",
        "| None | Dense | 29.00 | – |",
        "| Wanda | 2:4 | – | 25.00 |",
        "| Wanda+SPP | 2:4 | 27.00 | 30.00 |",
    ]


def test_table6_ablation_variants(tmp_path):
    runs = [
        summary(r=16, ppl=20.0, trainable=160),
        summary(r=4, ppl=23.0, trainable=40),
        summary(r=8, ppl=21.0, trainable=80),
        summary(r=16, use_beta=False, alpha_init="zeros", ppl=22.0, trainable=150),
        summary(r=16, alpha_init="kaiming", beta_init="kaiming", ppl=24.0, trainable=160),
        summary(r=16, alpha_init="zeros", beta_init="kaiming", ppl=25.0, trainable=160),
        summary(r=16, residual=False, ppl=30.0, trainable=160, train_last=3.25),
    ]
    lines = table_lines(collect.collect("table6", [write_runs(tmp_path, runs)]))
    assert lines[0] == ("| Model | Method | Sparsity | Zero-init | W_β | r | Residual | LM-eval | PPL pruned | PPL | "
                        "Gap closed (%) | Train loss (last) | Trainable | Seeds |")
    assert lines[2:] == [
        "| m | Wanda+SPP | 2:4 | β | ✓ | 4 | yes | – | 40.00 | 23.00 | 39.9 | 2.500 | 40 | 0 |",
        "| m | Wanda+SPP | 2:4 | β | ✓ | 8 | yes | – | 40.00 | 21.00 | 46.5 | 2.500 | 80 | 0 |",
        "| m | Wanda+SPP | 2:4 | none | ✓ | 16 | yes | – | 40.00 | 24.00 | 36.8 | 2.500 | 160 | 0 |",
        "| m | Wanda+SPP | 2:4 | none (α=β=1, no residual) | ✓ | 16 | no | – | 40.00 | 30.00 | 20.8 | 3.250 | 160 "
        "| 0 |",
        "| m | Wanda+SPP | 2:4 | α | ✓ | 16 | yes | – | 40.00 | 25.00 | 33.9 | 2.500 | 160 | 0 |",
        "| m | Wanda+SPP | 2:4 | α | ✗ | 16 | yes | – | 40.00 | 22.00 | 43.1 | 2.500 | 150 | 0 |",
        "| m | Wanda+SPP | 2:4 | β | ✓ | 16 | yes | – | 40.00 | 20.00 | 50.0 | 2.500 | 160 | 0 |",
    ]


def test_cli_writes_file_and_errors_name_the_fix(tmp_path, capsys):
    root = write_runs(tmp_path / "runs", [summary()])
    out = tmp_path / "t.md"
    report = collect.main(["table6", str(root), "--out", str(out), "--title", "Ablation"])
    assert out.read_text() == report and report.startswith("# Ablation\n")
    assert capsys.readouterr().out == report
    with pytest.raises(ValueError, match="use one of table2"):
        collect.collect("table9", [root])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        collect.collect("table2", [tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no summary.json"):
        collect.collect("table2", [tmp_path / "empty"])
    bad = tmp_path / "bad" / "summary.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"results": {}}))
    with pytest.raises(ValueError, match="not a train.py summary.json"):
        collect.collect("table2", [bad.parent])
