"""The one-epoch methods study tools: learning-rate choice on the validation loss only, and the method comparison with
paired intervals (synthetic ``summary.json`` files whose answers are known in closed form)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from lab import lr_select
from lab import methods_one_epoch as campaign
from lab import methods_one_epoch_figure as campaign_figure

TASKS = ("spp_boolq", "spp_rte", "spp_hellaswag", "spp_winogrande", "spp_arc_easy", "spp_arc_challenge",
         "spp_openbookqa")
STARTS = list(range(0, 40 * 7168, 7168))
SPP_NLL = [4.0 + 0.2 * (i % 5) for i in range(40)]
"""Per-window NLL of a fine-tuned run in the synthetic campaigns below."""


def ppl_entry(nll: list[float]) -> dict[str, Any]:
    mean = sum(nll) / len(nll)
    return {"ppl": math.exp(mean), "window_nll": nll, "window_starts": STARTS[: len(nll)], "source": "wikitext2",
            "seqlen": 512, "windows": len(nll), "ci_low": math.exp(mean - 0.1), "ci_high": math.exp(mean + 0.1)}


def summary(adapter: str = "spp", lr: float = 1e-2, seed: int = 0, val: tuple[float, ...] = (2.0,),
            merged: list[float] | None = None, acc: float = 0.5, se: float = 0.01) -> dict[str, Any]:
    """A summary.json with the fields the campaign tools read (layout of train.py's)."""
    base = [5.0 + 0.1 * (i % 3) for i in range(40)]
    dense = [3.0 + 0.1 * (i % 3) for i in range(40)]
    return {
        "run": {"adapter": adapter},
        "perplexity": {"dense": ppl_entry(dense), "pruned": ppl_entry(base),
                       "merged": ppl_entry(merged) if merged else None},
        "zero_shot": {"metrics": {t: {"acc": acc, "acc_stderr": se} for t in TASKS}},
        "params": {"trainable": 100, "frozen": 1000, "total": 1100},
        "losses": {"val": list(val), "train_last": 2.0, "optimizer_steps": 10 if adapter != "none" else 0},
        "timings": {"train": 50.0},
        "memory": {"peak_mib": 2048.0},
        "config": {"model": {"name": "m"}, "pruner": {"name": "wanda"},
                   "sparsity": {"name": "nm2_4", "kind": "nm", "ratio": None, "n": 2, "m": 4},
                   "adapter": {"name": adapter, "r": 16}, "seed": seed, "trainer": {"lr": lr},
                   "data": {"max_examples": 540, "max_length": 128, "train_batch_size": 8},
                   "calibration": {"source": "c4", "nsamples": 32, "seqlen": 512},
                   "eval": {"ppl_source": "wikitext2", "seqlen": 512, "max_windows": 40,
                            "window_sampling": "systematic", "tasks": ["spp_zeroshot"], "limit": 200,
                            "doc_seed": 0}},
    }


def write(root: Path, name: str, data: dict[str, Any]) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(data))
    return d


def test_lr_select_picks_the_lowest_last_validation_loss(tmp_path: Path, capsys):
    for lr, val in ((1e-4, (3.0, 2.9)), (1e-3, (2.8, 2.5)), (1e-2, (2.2, 2.6)), (1e-1, (float("nan"),))):
        write(tmp_path, f"lr{lr:g}", summary(lr=lr, val=val))
    (tmp_path / "lr1e-05.failed.log").write_text("Traceback ...")        # a failed job: no summary.json
    (tmp_path / "lr1e+00.running.log").write_text("step 3/34")            # a running job: not a grid point yet
    points = lr_select.load_grid(tmp_path)
    assert [p.lr for p in points] == [1e-5, 1e-4, 1e-3, 1e-2, 1e-1] and points[0].failed
    assert lr_select.best(points).lr == 1e-3          # last loss 2.5 beats 2.6 (whose minimum 2.2 is not the value)
    assert points[-1].objective == math.inf           # a diverged run never wins
    assert lr_select.main([str(tmp_path), "--print-lr"]) == 0
    assert capsys.readouterr().out == "0.001\n"
    out = tmp_path / "grid.md"
    assert lr_select.main([str(tmp_path), "--out", str(out)]) == 0
    chosen = [line for line in out.read_text().splitlines() if line.endswith("✓ |")]
    assert chosen == ["| 0.001 | 2.5000 | 2.8000, 2.5000 | ✓ |"]
    assert "| 1e-05 | inf | job failed (`lr1e-05.failed.log`) |  |" in out.read_text()


def test_lr_select_on_the_merged_validation_perplexity(tmp_path: Path, capsys):
    """``--objective ppl_val_merged`` picks the lowest merged WikiText-2 validation perplexity, which
    here disagrees with the validation loss; a run that did not measure it is never chosen."""
    for lr, val, ppl in ((1e-3, (2.5,), 40.0), (1e-2, (2.2,), 45.0), (1e-1, (2.0,), None)):
        data = summary(lr=lr, val=val)
        if ppl is not None:
            data["merged_ppl_by_source"] = {"wikitext2_val": {"ppl": ppl, "source": "wikitext2_val"}}
        write(tmp_path, f"lr{lr:g}", data)
    assert lr_select.best(lr_select.load_grid(tmp_path)).lr == 1e-1
    points = lr_select.load_grid(tmp_path, "ppl_val_merged")
    assert lr_select.best(points).lr == 1e-3 and points[-1].objective == math.inf
    assert lr_select.main([str(tmp_path), "--objective", "ppl_val_merged", "--print-lr"]) == 0
    assert capsys.readouterr().out == "0.001\n"
    table = lr_select.grid_table(points)
    assert "objective: merged WikiText-2 validation perplexity" in table
    assert "| 0.001 | 40.00 | 2.5000 | 2.5000 | ✓ |" in table and "| 0.1 | – | 2.0000 | 2.0000 |  |" in table
    with pytest.raises(ValueError, match="choose one of val_loss, ppl_val_merged"):
        lr_select.load_grid(tmp_path, "ppl_merged")  # a test-split number never selects


def test_lr_select_refuses_an_empty_or_mixed_grid_in_one_line(tmp_path: Path, capsys):
    assert lr_select.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no summary.json" in err and "run.sh A" in err
    write(tmp_path, "a", summary(adapter="spp"))
    write(tmp_path, "b", summary(adapter="lora"))
    assert lr_select.main([str(tmp_path)]) == 2
    assert "mixes methods ['lora', 'spp']" in capsys.readouterr().err


def test_campaign_paired_rows_against_spp(tmp_path: Path):
    spp_nll = SPP_NLL
    write(tmp_path, "nm2_4/spp_s0", summary("spp", merged=spp_nll, acc=0.50))
    # LoRA*: every window exactly 0.1 nats worse -> ratio exp(0.1) with a zero-width interval; zero-shot 3 points
    # lower with se 0.01 per task: se of the mean 0.01/sqrt(7) each, difference se 0.01*sqrt(2/7) -> distinguishable
    write(tmp_path, "nm2_4/lora_s0", summary("lora", merged=[x + 0.1 for x in spp_nll], acc=0.47))
    # SparsePEFT: windows alternate +0.3 / -0.3 -> mean 0, interval around 0; zero-shot equal
    write(tmp_path, "nm2_4/sparse_lora_s0",
          summary("sparse_lora", merged=[x + (0.3 if i % 2 else -0.3) for i, x in enumerate(spp_nll)], acc=0.50))
    write(tmp_path, "nm2_4/none_wanda", summary("none"))
    full = summary("masked_full", merged=spp_nll)
    full["params"]["trainable"], full["merge"] = 1000, {"kept_params": 500}   # whole tensors vs kept weights
    write(tmp_path, "nm2_4/masked_full_s0", full)
    write(tmp_path, "lr_select/spp/lr1", summary("spp", merged=spp_nll))     # a grid point: never in the tables
    report = campaign.collect_campaign([tmp_path])
    rows = {r.split(" | ")[1]: r for r in report.splitlines() if r.startswith("| 2:4 | Wanda ")}
    lora = rows["Wanda LoRA*"].split(" | ")
    ratio = f"{math.exp(0.1):.3f}"
    assert lora[3] == f"{ratio} [{ratio}, {ratio}]" and lora[4] == "SPP better"
    diff_se = 1.959963984540054 * 0.01 * math.sqrt(2 / 7)
    assert lora[5] == f"-3.00 ± {100 * diff_se:.2f}" and lora[6] == "SPP better |"
    sparse = rows["Wanda SparsePEFT"].split(" | ")
    assert sparse[3].startswith("1.000 [") and sparse[4] == "not distinguishable"
    assert sparse[6] == "not distinguishable |"
    pruned = rows["Wanda pruned"].split(" | ")
    assert float(pruned[3].split()[0]) == pytest.approx(math.exp(sum(summary("none")["perplexity"]["pruned"]
                                                                   ["window_nll"]) / 40 - sum(spp_nll) / 40), abs=1e-3)
    main_rows = [r for r in report.splitlines() if r.startswith("| 2:4 | Wanda | ")]
    assert [r.split(" | ")[2] for r in main_rows] == ["pruned", "SPP", "SparsePEFT", "LoRA*", "masked full FT"]
    assert main_rows[4].split(" | ")[8] == "500" and main_rows[1].split(" | ")[8] == "100"
    spp_row = main_rows[1].split(" | ")
    assert spp_row[4] == "0" and spp_row[9] == "5.0" and spp_row[11] == "2.00 |"   # 50 s / 10 steps; 2048 MiB
    assert report.splitlines()[4].startswith("| Dense | – | dense | ")


def test_campaign_seed_rows_keep_the_one_zero_shot_seeds_standard_error(tmp_path: Path):
    """Seeds 1-2 run perplexity only: the 7-task cell shows seed 0's mean with its se and names the seed."""
    nll = SPP_NLL
    write(tmp_path, "nm2_4/spp_s0", summary("spp", merged=nll, acc=0.40, se=0.021))
    for seed in (1, 2):
        later = summary("spp", seed=seed, merged=[x + 0.01 * seed for x in nll])
        later["zero_shot"] = None
        write(tmp_path, f"nm2_4/spp_s{seed}", later)
    row = next(r for r in campaign.collect_campaign([tmp_path]).splitlines() if r.startswith("| 2:4 | Wanda | SPP"))
    cells = row.split(" | ")
    assert cells[4] == "0,1,2"
    assert cells[7] == f"40.00 (se {100 * 0.021 / math.sqrt(7):.2f}; seed 0)"   # se of a 7-task mean: se/sqrt(7)


def test_campaign_rows_group_each_pruner_before_the_next(tmp_path: Path):
    """Wanda's block (pruned, then the methods), then SparseGPT's, in the main and the paired table."""
    nll = SPP_NLL
    for pruner in ("sparsegpt", "wanda"):
        for adapter in ("lora", "spp", "none"):
            data = summary(adapter, merged=nll if adapter != "none" else None)
            data["config"]["pruner"]["name"] = pruner
            write(tmp_path, f"{pruner}/{adapter}", data)
    lines = campaign.collect_campaign([tmp_path]).splitlines()
    main = [r.split(" | ")[1:3] for r in lines if r.startswith("| 2:4 | ") and r.count(" | ") == 11]
    assert main == [["Wanda", "pruned"], ["Wanda", "SPP"], ["Wanda", "LoRA*"],
                    ["SparseGPT", "pruned"], ["SparseGPT", "SPP"], ["SparseGPT", "LoRA*"]]
    paired = [r.split(" | ")[1] for r in lines if r.startswith("| 2:4 | ") and r.count(" | ") == 6]
    assert paired == ["Wanda pruned", "Wanda LoRA*", "SparseGPT pruned", "SparseGPT LoRA*"]


def test_campaign_tokens_per_s_is_the_median_of_the_logged_column(tmp_path: Path):
    run_dir = write(tmp_path, "spp_s0", summary("spp", merged=[4.0] * 40))
    (run_dir / "csv" / "version_0").mkdir(parents=True)
    (run_dir / "csv" / "version_0" / "metrics.csv").write_text(
        "step,train/loss,train/device/items_per_sec\n9,2.0,70.0\n9,,\n19,1.9,90.0\n29,1.8,75.0\n")
    assert campaign.logged_tokens_per_s(run_dir) == 75.0
    assert campaign.load_campaign_run(run_dir / "summary.json").tokens_per_s == 75.0


def test_campaign_figure_is_drawn_from_the_runs_alone(tmp_path: Path):
    write(tmp_path, "runs/spp_s0", summary("spp", merged=[4.0] * 40))
    write(tmp_path, "runs/spp_s1", summary("spp", seed=1, merged=[4.1] * 40))
    write(tmp_path, "runs/none", summary("none"))
    out = tmp_path / "fig" / "campaign.png"
    assert campaign_figure.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert [p.name for p in out.parent.iterdir()] == ["campaign.png"]          # no temporary left behind
    assert campaign_figure.main([str(tmp_path / "none"), "--out", str(out)]) == 2


def test_campaign_prompt_masked_spp_is_its_own_row_compared_with_spp(tmp_path: Path):
    """`data.train_on_inputs=false` is another training objective: not a fourth seed of SPP, but a row of its own,
    paired against SPP on the same windows."""
    write(tmp_path, "nm2_4/spp_s0", summary("spp", merged=SPP_NLL))
    masked = summary("spp", merged=[x + 0.2 for x in SPP_NLL])
    masked["config"]["data"]["train_on_inputs"] = False
    write(tmp_path, "nm2_4/spp_s0_prompt_masked", masked)
    write(tmp_path, "nm2_4/none_wanda", summary("none"))
    lines = campaign.collect_campaign([tmp_path]).splitlines()
    main = [r.split(" | ")[2:5] for r in lines if r.startswith("| 2:4 | Wanda | ")]
    assert [m[0] for m in main] == ["pruned", "SPP", "SPP (prompt masked)"]
    assert main[1][2] == "0" and main[2][2] == "0"                     # one seed each, not seeds "0,0"
    paired = {r.split(" | ")[1]: r.split(" | ") for r in lines if r.startswith("| 2:4 | Wanda ")}
    ratio = f"{math.exp(0.2):.3f}"
    assert paired["Wanda SPP (prompt masked)"][3] == f"{ratio} [{ratio}, {ratio}]"
    assert paired["Wanda SPP (prompt masked)"][4] == "SPP better"
    assert "Wanda SPP" not in paired                                   # SPP is the reference, not a compared row
    out = tmp_path / "fig.png"
    assert campaign_figure.main([str(tmp_path / "nm2_4"), "--out", str(out)]) == 0
