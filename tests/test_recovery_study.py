"""The recovery study tooling on a synthetic campaign written in the real raw-file layout: learning-rate selection on
validation perplexity only, grid extension past a chosen endpoint, the two-level paired interval, the zero-shot and
recovery sections, and the committed report regenerating byte for byte."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from lab.lr_select import best, load_grid
from lab.recovery import selection
from lab.recovery.__main__ import main as cli
from lab.recovery.choices import choices, closest_competitor
from lab.recovery.records import load
from lab.recovery.recovery import at_minutes, minutes_to
from lab.recovery.stats import paired_ratio
from lab.recovery.tables import report
from lab.recovery.zero_shot import same_model
from spp.eval.perplexity import gap_closed, paired_difference

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = 40
BASE = np.random.default_rng(7).normal(4.6, 0.3, WINDOWS)  # a shared per-window difficulty


def entry(shift: float, source: str = "wikitext2", noise: float = 0.0, seed: int = 0) -> dict:
    """A perplexity entry whose per-window NLL is ``BASE + shift`` (+ optional noise)."""
    nll = BASE + shift + (np.random.default_rng(seed).normal(0, noise, WINDOWS) if noise else 0.0)
    ppl = float(np.exp(nll.mean()))
    return {"ppl": ppl, "nll_mean": float(nll.mean()), "seqlen": 512, "windows": WINDOWS, "source": source,
            "window_nll": [float(v) for v in nll], "window_starts": list(range(0, 512 * WINDOWS, 512)),
            "ci_low": ppl * 0.9, "ci_high": ppl * 1.1}


def write_train(root: Path, rel: str, adapter: str, lr: float, seed: int, test: float, val: float,
                sparsity: str = "nm2_4", pruner: str = "wanda", noise: float = 0.0, objective: str = "ce") -> Path:
    """A ``summary.json`` in train.py's shape: merged test NLL = BASE + ``test``, validation = BASE + ``val``."""
    run_dir = root / rel
    run_dir.mkdir(parents=True)
    data = {"run": {"pruner": pruner, "sparsity": sparsity, "adapter": adapter, "objective": objective},
            "config": {"trainer": {"lr": lr}, "seed": seed, "adapter": {"name": adapter}},
            "perplexity": {"dense": entry(-1.5), "pruned": entry(0.0), "merged": entry(test, noise=noise, seed=seed)},
            "merged_ppl_by_source": {"wikitext2_val": entry(val, "wikitext2_val")},
            "losses": {"val": [2.5, 2.2], "optimizer_steps": 63}, "timings": {"train": 630.0, "total": 900.0},
            "params": {"trainable": 1000}}
    (run_dir / "summary.json").write_text(json.dumps(data))
    return run_dir


def test_ladders_and_neighbours():
    assert selection.neighbour(1e-1, selection.LADDERS["1-2-5"], up=True) == "2e-1"
    assert selection.neighbour(1e-2, selection.LADDERS["1-2-5"], up=False) == "5e-3"
    assert selection.neighbour(3e-2, selection.LADDERS["1-3"], up=True) == "1e-1"
    assert selection.neighbour(1e-3, selection.LADDERS["1-3"], up=False) == "3e-4"
    assert selection.ladder_of([1e-2, 2e-2, 5e-2]) == (1, 2, 5)
    assert selection.ladder_of([3e-3, 1e-2]) == (1, 3)
    with pytest.raises(ValueError, match="one digit"):
        selection.mantissa_exponent(2.5e-3)


def test_selection_is_on_validation_never_test(tmp_path: Path):
    """lr 1e-2 has the best TEST perplexity, 3e-2 the best VALIDATION one: 3e-2 is chosen (negative control: choosing
    on test would pick 1e-2), by the report and by lr_select alike."""
    for lr, test, val in [(3e-3, 0.0, 0.0), (1e-2, -0.5, -0.2), (3e-2, -0.3, -0.4), (1e-1, 0.2, 0.1)]:
        write_train(tmp_path, f"grid/nm2_4/lora/lr{lr:g}", "lora", lr, 0, test, val)
    chosen = choices(load(tmp_path))[("nm2_4", "lora")]
    assert chosen.chosen.lr == 3e-2 and chosen.interior
    assert best(load_grid(tmp_path / "grid/nm2_4/lora", "ppl_val_merged")).lr == 3e-2
    assert min(chosen.grid, key=lambda r: r.test["ppl"]).lr == 1e-2  # the test split would have chosen otherwise
    assert selection.next_point(tmp_path / "grid/nm2_4/lora") == ""


def test_a_chosen_endpoint_extends_the_grid(tmp_path: Path, capsys):
    for lr, val in [(1e-2, 0.0), (2e-2, -0.1), (5e-2, -0.2), (1e-1, -0.3)]:
        write_train(tmp_path, f"grid/nm2_4/spp/lr{lr:g}", "spp", lr, 0, val, val)
    assert cli(["extend", str(tmp_path / "grid/nm2_4/spp")]) == 0
    assert capsys.readouterr().out.strip() == "2e-1"
    write_train(tmp_path, "grid/nm2_4/spp/lr2e-1", "spp", 2e-1, 0, 0.5, 0.5)
    assert selection.next_point(tmp_path / "grid/nm2_4/spp") == ""
    assert choices(load(tmp_path))[("nm2_4", "spp")].interior  # interior once extended


def test_grid_status_tells_a_running_grid_from_a_chosen_endpoint(tmp_path: Path):
    """Two of three base points, best at the top: still running. All three, best at the top, no extension: the
    report says endpoint (what the committed-grid test below refuses). Extended past it: interior."""
    for lr, val in [(3e-3, 0.0), (1e-2, -0.1)]:
        write_train(tmp_path, f"grid/nm2_4/lora/lr{lr:g}", "lora", lr, 0, val, val)
    assert choices(load(tmp_path))[("nm2_4", "lora")].grid_status == "running: 2 of 3 base points"
    write_train(tmp_path, "grid/nm2_4/lora/lr3e-2", "lora", 3e-2, 0, -0.2, -0.2)
    assert choices(load(tmp_path))[("nm2_4", "lora")].grid_status == "**no: endpoint**"
    write_train(tmp_path, "grid/nm2_4/lora/lr1e-1", "lora", 1e-1, 0, 0.3, 0.3)
    assert choices(load(tmp_path))[("nm2_4", "lora")].grid_status == "yes"
    assert cli(["grid-rates", "lora"]) == 0 and cli(["grid-rates", "no_such_method"]) == 2


def test_other_settings_centre_their_grid_on_the_settled_wanda_2_4_choice(tmp_path: Path, capsys):
    """Once SPP's Wanda 2:4 grid is interior at 2e-2, unstructured 50 % runs 1e-2, 2e-2, 5e-2 (the report counts
    those as its base points); while the anchor grid still sits at an endpoint, the full base grid applies
    (negative control), and the anchor setting always runs the full base grid."""
    root = tmp_path
    for lr, val in [(1e-2, -0.1), (2e-2, -0.2), (5e-2, -0.3)]:  # best at the top endpoint: not settled
        write_train(root, f"grid/nm2_4/spp/lr{lr:g}", "spp", lr, 0, val, val)
    assert selection.settled_anchor(root, "unstructured50", "spp") is None
    assert cli(["grid-rates", "spp", "--setting", "unstructured50", "--root", str(root)]) == 0
    assert capsys.readouterr().out.split() == list(selection.BASE_GRIDS["spp"])
    write_train(root, "grid/nm2_4/spp/lr1e-1", "spp", 1e-1, 0, 0.2, 0.2)  # the extension: 5e-2 is interior now
    assert selection.settled_anchor(root, "unstructured50", "spp") == 5e-2
    assert selection.settled_anchor(root, "nm2_4", "spp") is None
    assert cli(["grid-rates", "spp", "--setting", "unstructured50", "--root", str(root)]) == 0
    assert capsys.readouterr().out.split() == ["2e-2", "5e-2", "1e-1"]
    assert selection.base_grid("lora", 3e-3) == ("1e-3", "3e-3", "1e-2")
    for lr, val in [(2e-2, -0.1), (5e-2, -0.2)]:
        write_train(root, f"grid/unstructured50/spp/lr{lr:g}", "spp", lr, 0, val, val, sparsity="unstructured50")
    ch = choices(load(root))[("unstructured50", "spp")]
    assert ch.base == (2e-2, 5e-2, 1e-1) and ch.grid_status == "running: 2 of 3 base points"
    write_train(root, "grid/unstructured50/spp/lr1e-1", "spp", 1e-1, 0, 0.1, 0.1, sparsity="unstructured50")
    assert choices(load(root))[("unstructured50", "spp")].grid_status == "yes"


def test_no_committed_grid_chose_an_endpoint():
    """Every chosen rate lies inside its grid. A committed grid is either still running (its base points
    not all there) or interior; a finished base grid at an endpoint must be committed with its extension."""
    chosen = choices(load(ROOT / "experiments/results/runs/recovery"))
    assert chosen, "no committed recovery-study grid"
    bad = {k: ch.grid_status for k, ch in chosen.items() if ch.grid_status == "**no: endpoint**"}
    assert not bad, f"grids at an endpoint without their extension: {bad}"


def test_one_seed_interval_is_the_windows_bootstrap_and_seeds_widen_it():
    a, b = entry(-0.10, noise=0.05, seed=1), entry(0.0)
    one = paired_ratio([a], [b])
    ref = paired_difference(a, b)
    assert one.ratio == pytest.approx(ref["ppl_ratio"]) and one.low == pytest.approx(ref["ppl_ratio_low"])
    assert one.high == pytest.approx(ref["ppl_ratio_high"])
    same = paired_ratio([entry(-0.1)] * 3, [entry(0.0)] * 3)  # a constant shift: no spread at all
    assert same.low == pytest.approx(math.exp(-0.1)) and same.high == pytest.approx(math.exp(-0.1))
    spread = paired_ratio([entry(-0.3), entry(-0.1), entry(0.1)], [entry(0.0)] * 3)
    assert spread.ratio == pytest.approx(math.exp(-0.1))
    assert spread.low < math.exp(-0.25) and spread.high > math.exp(0.05)  # the seeds' spread is in the interval
    assert spread.per_seed == pytest.approx((math.exp(-0.3), math.exp(-0.1), math.exp(0.1)))


def test_report_numbers_follow_from_the_raw_files(tmp_path: Path):
    for lr, val in [(1e-2, -0.2), (2e-2, -0.4), (5e-2, -0.3)]:
        write_train(tmp_path, f"grid/nm2_4/spp/lr{lr:g}", "spp", lr, 0, val - 0.05, val)
    for lr, val in [(3e-3, -0.1), (1e-2, -0.3), (3e-2, -0.2)]:
        write_train(tmp_path, f"grid/nm2_4/lora/lr{lr:g}", "lora", lr, 0, val + 0.05, val)
    for s in (1, 2):
        write_train(tmp_path, f"seeds/nm2_4/spp/s{s}", "spp", 2e-2, s, -0.45 + 0.01 * s, -0.4)
        write_train(tmp_path, f"seeds/nm2_4/lora/s{s}", "lora", 1e-2, s, -0.25 - 0.01 * s, -0.3)
    write_train(tmp_path, "seeds/nm2_4/lora/s9", "lora", 3e-2, 9, 0.0, 0.0)  # another rate: not a seed of the choice
    c = load(tmp_path)
    chosen = choices(c)
    assert [r.seed for r in chosen[("nm2_4", "spp")].runs] == [0, 1, 2]
    assert [r.seed for r in chosen[("nm2_4", "lora")].runs] == [0, 1, 2]
    assert closest_competitor(chosen, "nm2_4") == "lora"
    text = report(tmp_path)
    per_seed = [(-0.25) - (-0.45), (-0.26) - (-0.44), (-0.27) - (-0.43)]  # the same on every window
    lora_minus_spp = np.mean(per_seed)
    half = 4.302653 * np.std(per_seed, ddof=1) / math.sqrt(3)  # t(0.975, 2); no window-to-window variance here
    assert (f"| {math.exp(lora_minus_spp):.3f} | [{math.exp(lora_minus_spp - half):.3f}, "
            f"{math.exp(lora_minus_spp + half):.3f}] |") in text
    assert "| Wanda 2:4 | LoRA* | 0,1,2 |" in text and "SPP better" in text
    gaps = [(0.0 - shift) / 1.5 for shift in (-0.45, -0.44, -0.43)]  # pruned at BASE, dense at BASE - 1.5
    assert f"| {100 * np.mean(gaps):.1f} ± {100 * np.std(gaps, ddof=1):.1f} |" in text
    assert "lowest mean test PPL on the seeds every method has (0,1,2) **SPP**" in text


def write_spp_and_masked_grids(root: Path) -> None:
    """Seed-0 grids at Wanda 2:4: SPP chooses 2e-2 (test -0.3), masked full FT 1e-3 (test -0.28)."""
    for lr, val in [(1e-2, -0.1), (2e-2, -0.3), (5e-2, -0.2)]:
        write_train(root, f"grid/nm2_4/spp/lr{lr:g}", "spp", lr, 0, -0.3, val)
    for lr, val in [(3e-4, -0.1), (1e-3, -0.25), (3e-3, -0.2)]:
        write_train(root, f"grid/nm2_4/masked_full/lr{lr:g}", "masked_full", lr, 0, -0.28, val)


def test_one_seed_names_no_winner_and_winners_compare_shared_seeds(tmp_path: Path):
    """Masked full FT has seed 0 only, 2 % above SPP's seed 0 on every window; SPP's seeds 1, 2 are 5 % above masked
    full FT's seed 0. The pair is one seed: its interval covers windows only, so the verdict names no winner; the
    winner line compares seed 0 (SPP), not SPP's 3-seed mean with a 1-seed value (negative control: masked full FT)."""
    write_spp_and_masked_grids(tmp_path)
    for s in (1, 2):
        write_train(tmp_path, f"seeds/nm2_4/spp/s{s}", "spp", 2e-2, s, -0.23, -0.3)
    chosen = choices(load(tmp_path))
    assert statistics.mean(r.test["ppl"] for r in chosen[("nm2_4", "spp")].runs) > \
        chosen[("nm2_4", "masked_full")].runs[0].test["ppl"]
    text = report(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| Wanda 2:4 | masked full FT | 0 |"))
    assert "| SPP lower on 1 seed (windows only) |" in row and "SPP better" not in text
    assert "lowest mean test PPL on the seeds every method has (0) **SPP**" in text


def test_winner_line_adds_spp_and_its_rival_on_their_shared_seeds(tmp_path: Path):
    """Unstructured 75 %'s case: LoRA* has seed 0 only, so the all-methods line compares seed 0 (SPP lowest); SPP and
    its closest competitor (masked full FT, lower validation PPL than LoRA*) have seeds 0-2, on which masked full FT's
    mean is lower (SPP: -0.30, -0.23, -0.23; masked full FT: -0.28 on each seed): the line names it too."""
    write_spp_and_masked_grids(tmp_path)
    for lr, val in [(1e-3, -0.05), (3e-3, -0.15), (1e-2, -0.1)]:
        write_train(tmp_path, f"grid/nm2_4/lora/lr{lr:g}", "lora", lr, 0, -0.2, val)
    for s in (1, 2):
        write_train(tmp_path, f"seeds/nm2_4/spp/s{s}", "spp", 2e-2, s, -0.23, -0.3)
        write_train(tmp_path, f"seeds/nm2_4/masked_full/s{s}", "masked_full", 1e-3, s, -0.28, -0.25)
    text = report(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("- Wanda 2:4:"))
    assert "seeds every method has (0) **SPP**" in line
    assert "closest competitor on validation PPL: masked full FT; of these two on seeds 0,1,2: **masked full FT** (" \
        in line
    only_two = tmp_path / "two"
    for d in ("grid/nm2_4/spp", "grid/nm2_4/masked_full", "seeds"):  # negative control: without LoRA*, no extra clause
        shutil.copytree(tmp_path / d, only_two / d)
    assert "of these two" not in report(only_two)


def test_recovery_reading_is_linear_between_points():
    pts = [{"cpu_min": 0.0, "gap": 0.0, "low": 0.0, "high": 0.0, "step": 0},
           {"cpu_min": 10.0, "gap": 0.5, "low": 0.4, "high": 0.6, "step": 30},
           {"cpu_min": 20.0, "gap": 0.7, "low": 0.6, "high": 0.8, "step": 60}]
    assert at_minutes(pts, 15.0) == pytest.approx({"gap": 0.6, "low": 0.5, "high": 0.7})
    assert minutes_to(pts, 0.6) == pytest.approx(15.0)
    assert minutes_to(pts, 0.9) is None and at_minutes(pts, 25.0) is None
    g = gap_closed(entry(-1.5), entry(0.0), entry(-0.75))
    assert g["gap_closed"] == pytest.approx(0.5)


def write_ce_and_distill(root: Path, ce: dict[str, float], distill: dict[str, float]) -> None:
    """SPP (2e-2) and SparsePEFT (3e-3, SPP's closest competitor on validation) at Wanda 2:4, seeds 0-2, trained with
    cross-entropy and distilled: merged test NLL = BASE + the method's shift + the seed's noise (the same noise for
    every method of a seed, so paired ratios are exact)."""
    for m, lr in (("spp", 2e-2), ("sparse_lora", 3e-3)):
        write_train(root, f"grid/nm2_4/{m}/lr{lr:g}", m, lr, 0, ce[m], -0.4 if m == "spp" else -0.3, noise=0.05)
        for s in (1, 2):
            write_train(root, f"seeds/nm2_4/{m}/s{s}", m, lr, s, ce[m], 0.0, noise=0.05)
        for s in (0, 1, 2):
            write_train(root, f"distill/nm2_4/{m}/s{s}", m, lr, s, distill[m], 0.0, noise=0.05, objective="distill")


def test_distillation_section_pairs_each_method_with_its_cross_entropy_runs(tmp_path: Path):
    """Under cross-entropy SPP is 0.02 nats lower than SparsePEFT; distilled, SparsePEFT is 0.05 nats lower: the
    section reports distill / CE = exp(-0.05) for SPP and exp(-0.12) for SparsePEFT, and that the verdict changed; with
    the same order under both objectives (negative control) it says no change."""
    write_ce_and_distill(tmp_path / "a", {"spp": -0.50, "sparse_lora": -0.48}, {"spp": -0.55, "sparse_lora": -0.60})
    text = report(tmp_path / "a")
    section = text.split("## Distillation")[1].split("\n## ")[0]
    rows = {line.split(" | ")[1]: line for line in section.splitlines() if line.startswith("| Wanda 2:4 |")}
    same = f"[{math.exp(-0.05):.3f}, {math.exp(-0.05):.3f}]"  # every seed and window 0.05 nats lower: no spread
    assert f"| {math.exp(-0.05):.3f} {same} | {same} | distill better |" in rows["SPP"]
    assert f"| {math.exp(-0.12):.3f} [" in rows["SparsePEFT"]
    line = next(x for x in text.splitlines() if x.startswith("- Wanda 2:4: cross-entropy"))
    assert f"SparsePEFT / SPP {math.exp(0.02):.3f}" in line and "lower mean SPP, SPP better" in line
    assert f"SparsePEFT / SPP {math.exp(-0.05):.3f}" in line and "lower mean SparsePEFT, SparsePEFT better" in line
    assert line.endswith("Ranking changed by distillation: **the verdict changed**.")
    write_ce_and_distill(tmp_path / "b", {"spp": -0.50, "sparse_lora": -0.48}, {"spp": -0.60, "sparse_lora": -0.55})
    assert "Ranking changed by distillation: **no**." in report(tmp_path / "b")


def write_reference(root: Path, rel: str, val_shift: float) -> None:
    """An ``eval.py`` ``results.json`` whose validation windows' NLL is ``BASE + val_shift``."""
    (root / rel).mkdir(parents=True)
    record = {"ppl": {"wikitext2_val": entry(val_shift, "wikitext2_val")}, "tasks": {},
              "info": {"timings": {"prune": 600.0, "load": 60.0, "ppl_wikitext2_val": 1140.0}}}
    (root / rel / "results.json").write_text(json.dumps({"records": [record]}))


def test_recovery_section_and_figure_read_the_curves(tmp_path: Path):
    """A recovery run whose validation NLL falls from the pruned model's (BASE) by 0.3 every 16 steps of 5 CPU-minutes,
    with the dense model at BASE - 1.5: the gap closed is 0.2 per point, 15 CPU-min is the step-48 point (60 %), the
    60 % mark is reached at 15.0 min; a second method that closes half as much never reaches it (negative control);
    a third rises to 40 % at 10 min, then falls back to 20 % (a second epoch that overfits): its highest point is not
    its last."""
    write_reference(tmp_path, "reference/dense", -1.5)
    write_reference(tmp_path, "reference/nm2_4", 0.0)
    for method, shifts in (("spp", [0.3 * k for k in range(5)]), ("lora", [0.15 * k for k in range(5)]),
                           ("masked_full", [0.0, 0.3, 0.6, 0.45, 0.3])):
        run = write_train(tmp_path, f"recovery/nm2_4/{method}", method, 2e-2, 0, -0.5, -0.5)
        data = json.loads((run / "summary.json").read_text())
        data["recovery_curve"] = [{**entry(-shift, "wikitext2_val"), "step": 16 * k, "train_cpu_s": 300.0 * k}
                                  for k, shift in enumerate(shifts)]
        (run / "summary.json").write_text(json.dumps(data))
    text = report(tmp_path)
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| Wanda 2:4 |")}
    assert "| 60.0 [60.0, 60.0] | 15.0 | – | 80.0 at 20.0 min (step 64) | 80.0 at 20.0 min (step 64) |" in rows["SPP"]
    assert "| 30.0 [30.0, 30.0] | not within 20.0 |" in rows["LoRA*"]
    assert "| 40.0 at 10.0 min (step 32) | 20.0 at 20.0 min (step 64) |" in rows["masked full FT"]
    # at 15 CPU-min SPP's windows are BASE - 0.9, LoRA*'s BASE - 0.45 and masked full FT's BASE - 0.45
    for m in ("LoRA*", "masked full FT"):
        assert f"| {math.exp(0.45):.3f} [{math.exp(0.45):.3f}, {math.exp(0.45):.3f}] |" in rows[m]
    # three training runs of 900 s, two evaluations of 600 + 60 + 1140 s (eval.py's stage timings)
    assert "Runs: 3 training (`train.py`), 2 evaluation (`eval.py`); 1.8 job-hours at one thread each (0.8 training, " \
           "1.0 evaluation;" in text
    png = tmp_path / "fig.png"
    assert cli(["figure", str(tmp_path), "--out", str(png)]) == 0
    curves_drawn = {c["method"]: c["points"] for c in json.loads(png.with_suffix(".json").read_text())["recovery"]}
    assert [p["gap"] for p in curves_drawn["SPP"]] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8])
    assert [p["cpu_min"] for p in curves_drawn["LoRA*"]] == pytest.approx([0.0, 5.0, 10.0, 15.0, 20.0])


def write_curve(root: Path, rel: str, method: str, shifts: list[float], cpu_s_per_point: float, cpu: str) -> None:
    """A recovery run on CPU ``cpu``: validation NLL BASE - shift at point k, ``cpu_s_per_point`` CPU seconds apart."""
    run = write_train(root, rel, method, 2e-2, 0, -0.5, -0.5)
    data = json.loads((run / "summary.json").read_text())
    data["recovery_curve"] = [{**entry(-shift, "wikitext2_val"), "step": 16 * k, "train_cpu_s": cpu_s_per_point * k}
                              for k, shift in enumerate(shifts)]
    (run / "summary.json").write_text(json.dumps(data))
    (run / "machine.json").write_text(json.dumps({"cpu_model": cpu, "cpu_capability": "AVX512"}))


def test_recovery_reads_each_method_against_spp_on_its_own_cpu(tmp_path: Path):
    """SPP's curve on CPU A (5 CPU-min per point) is re-run on CPU B, which takes 1.2x the CPU time for the same steps
    and measures the same perplexities; masked full FT runs on B only, closing 0.3 nats per 5 CPU-min. At 15 CPU-min
    SPP-on-B is at BASE - 0.75 and masked full FT at BASE - 0.9: their ratio is exp(-0.15); against SPP-on-A
    (BASE - 0.9) it would be 1.000 (the negative control the report must not print). The check section states the 1.2
    ratio and no perplexity difference; without the re-run masked full FT has no SPP on its CPU and no ratio."""
    write_reference(tmp_path, "reference/dense", -1.5)
    write_reference(tmp_path, "reference/nm2_4", 0.0)
    shifts = [0.3 * k for k in range(5)]
    write_curve(tmp_path, "recovery/nm2_4/spp", "spp", shifts, 300.0, "CPU one")
    write_curve(tmp_path, "recovery/nm2_4/masked_full", "masked_full", shifts, 300.0, "CPU two")
    alone = report(tmp_path)
    rows = {line.split(" | ")[1]: line for line in alone.splitlines() if line.startswith("| Wanda 2:4 |")}
    assert rows["masked full FT"].startswith("| Wanda 2:4 | masked full FT | B | 60.0 [60.0, 60.0] | 15.0 | – |")
    assert "## The same recovery run on two CPUs" not in alone
    write_curve(tmp_path, "recovery_check/nm2_4/spp", "spp", shifts, 360.0, "CPU two")
    text = report(tmp_path)
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| Wanda 2:4 |")}
    ratio = f"{math.exp(-0.15):.3f}"
    assert f"| B | 60.0 [60.0, 60.0] | 15.0 | {ratio} [{ratio}, {ratio}] |" in rows["masked full FT"]
    assert "| Wanda 2:4 | SPP (re-run) | B | 50.0 [50.0, 50.0] | 18.0 | – |" in text
    assert "A = CPU one (AVX512); B = CPU two (AVX512)." in text
    check = text.split("## The same recovery run on two CPUs")[1].split("\n## ")[0]
    assert "| Wanda 2:4 | SPP | A → B | 20.0 → 24.0 | 1.200 (1.200–1.200) | 0 | 60.0 → 50.0 |" in check
    png = tmp_path / "fig.png"
    assert cli(["figure", str(tmp_path), "--out", str(png)]) == 0
    drawn = json.loads(png.with_suffix(".json").read_text())["recovery"]
    assert [(c["method"], c["cpu"], c["rerun"]) for c in drawn] == [
        ("SPP", "A", False), ("SPP (re-run)", "B", True), ("masked full FT", "B", False)]


COMMITTED = ROOT / "experiments/results/runs/recovery"
REPORT = ROOT / "experiments/results/recovery_smollm2_135m.md"


FIGURE_DATA = ROOT / "experiments/results/figures/recovery.json"


@pytest.mark.skipif(not REPORT.is_file(), reason="no committed recovery-study report yet")
def test_committed_recovery_study_report_regenerates_byte_identically():
    assert report(COMMITTED) == REPORT.read_text()


@pytest.mark.skipif(not FIGURE_DATA.is_file(), reason="no committed recovery-study figure yet")
def test_committed_recovery_study_figure_data_regenerates_byte_identically():
    from lab.recovery.figure import figure_data

    assert json.dumps(figure_data(COMMITTED), indent=1) + "\n" == FIGURE_DATA.read_text()


def test_command_line_queries_for_the_runner(tmp_path: Path, capsys):
    for m, lr, val in [("spp", 1e-2, -0.4), ("lora", 1e-2, -0.2), ("masked_full", 1e-3, -0.3)]:
        write_train(tmp_path, f"grid/nm2_4/{m}/lr{lr:g}", m, lr, 0, val, val)
    assert cli(["competitor", str(tmp_path), "nm2_4"]) == 0
    assert capsys.readouterr().out.strip() == "masked_full"
    assert cli(["val-ppl", str(tmp_path), "nm2_4", "lora"]) == 0
    assert float(capsys.readouterr().out) == pytest.approx(float(np.exp((BASE - 0.2).mean())), rel=1e-5)
    assert cli(["competitor", str(tmp_path), "unstructured50"]) == 2
    assert "no grid of a method other than SPP" in capsys.readouterr().err


def test_figure_draws_the_paired_ratios_it_writes(tmp_path: Path):
    for m, lr, shift in [("spp", 1e-2, -0.4), ("lora", 1e-2, -0.2), ("masked_full", 1e-3, -0.5)]:
        write_train(tmp_path / "c", f"grid/nm2_4/{m}/lr{lr:g}", m, lr, 0, shift, shift)
    png = tmp_path / "fig.png"
    assert cli(["figure", str(tmp_path / "c"), "--out", str(png)]) == 0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(png.with_suffix(".json").read_text())
    ratio = {r["method"]: r["ratio"] for r in data["ratios"]}
    assert ratio == pytest.approx({"LoRA*": math.exp(0.2), "masked full FT": math.exp(-0.1)}, rel=1e-5)
    assert cli(["figure", str(tmp_path / "empty_dir_missing"), "--out", str(png)]) == 2


def test_relativize_removes_the_machines_paths(tmp_path: Path):
    from lab.recovery.provenance import relativize
    from spp.paths import REPO_ROOT, SHARED_DATA_DIR

    job = write_train(tmp_path, "grid/nm2_4/spp/lr1e-2", "spp", 1e-2, 0, 0.0, 0.0)
    cache = tmp_path / "cache"
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    (job / "stdout.log").write_text(f"run {REPO_ROOT}/experiments/x lock {cache}/pruning/a.lock "
                                    f"data {SHARED_DATA_DIR}/wikitext2/test.json repo {REPO_ROOT}\n"
                                    f"{site}/peft/x.py:3: UserWarning\n")
    (job / "adapter").mkdir()
    (job / "adapter" / "adapter_config.json").write_text(f'"{REPO_ROOT}/x"')  # not committed: left alone
    running = tmp_path / "grid/nm2_4/spp/lr2e-2"
    running.mkdir()
    (running / "train.log").write_text(f"{REPO_ROOT}/y")  # no summary.json yet: left alone
    assert relativize(tmp_path, cache) == [job / "stdout.log"]
    assert (job / "stdout.log").read_text() == ("run experiments/x lock $SPP_CACHE_DIR/pruning/a.lock "
                                                "data ../shared/data/wikitext2/test.json repo .\n"
                                                "$SITE_PACKAGES/peft/x.py:3: UserWarning\n")
    assert str(REPO_ROOT) in (job / "adapter" / "adapter_config.json").read_text()
    assert str(REPO_ROOT) in (running / "train.log").read_text()


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed recovery-study runs yet")
def test_committed_recovery_study_records_name_no_absolute_path():
    import subprocess

    files = subprocess.run(["git", "ls-files", str(COMMITTED)], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        text = (ROOT / name).read_text(errors="replace")
        assert "/work/" not in text and "/root/" not in text and "/tmp/" not in text, name


def _runner(root: Path, *steps: str, **env: str) -> str:
    """What ``run.sh seq STEP...`` prints, run on the campaign directory ``root`` with ``env`` added."""
    import os
    import subprocess

    proc = subprocess.run(["bash", str(ROOT / "experiments/recovery/run.sh"), "seq", *steps],
                          env={**os.environ, "R": str(root), **env}, capture_output=True, text=True, timeout=300,
                          check=True)
    return proc.stdout


def _dry_jobs(root: Path, *steps: str) -> list[tuple[str, str, list[str]]]:
    """``(script, run dir, overrides)`` of every job ``run.sh seq STEP...`` would run (``DRY=1``: nothing runs)."""
    out = []
    for line in _runner(root, *steps, DRY="1").splitlines():
        if "would run:" in line:
            script, run_dir, *overrides = line.split("would run: ", 1)[1].split()
            out.append((script, run_dir, overrides))
    return out



def _trained_here(*run_dirs: Path) -> None:
    """What a run leaves in the checkout that trained it and git does not keep: its adapter and last checkpoint."""
    for run in run_dirs:
        (run / "adapter").mkdir()
        (run / "adapter" / "adapter_method.json").write_text("{}")
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "last.ckpt").write_text("")


@pytest.mark.slow  # three runs of the runner (56 s loaded); CI runs it
def test_zero_shot_trains_the_chosen_run_again_where_this_checkout_lacks_its_adapter(tmp_path: Path):
    """Adapters and checkpoints stay out of git, so a later checkout has the chosen run's records only: zero-shot then
    trains that run again (same rate, seed 0) into rerun/ (masked full FT: export/ without resuming) and scores it;
    in the checkout that trained it (negative control) the run's own adapter and checkpoint are used; a finished
    zero-shot is not redone."""
    for m, lr in {"spp": "2e-2", "masked_full": "1e-3"}.items():
        for name in selection.base_grid(m):
            write_train(tmp_path, f"grid/nm2_4/{m}/lr{name}", m, float(name), 0, 0.0, 0.0 if name == lr else 0.3)
    steps = ("zero_shot spp nm2_4", "zero_shot masked_full nm2_4")

    def jobs() -> list[tuple[str, str, dict[str, str]]]:
        return [(script, Path(d).relative_to(tmp_path).as_posix(), dict(o.split("=", 1) for o in overrides))
                for script, d, overrides in _dry_jobs(tmp_path, *steps)]

    later = jobs()
    assert [(s, d) for s, d, _ in later] == [("train.py", "rerun/nm2_4/spp"), ("eval.py", "zero_shot/nm2_4/spp"),
                                             ("train.py", "export/nm2_4/masked_full"),
                                             ("eval.py", "zero_shot/nm2_4/masked_full")]
    assert (float(later[0][2]["trainer.lr"]), later[0][2]["seed"], later[0][2]["adapter"]) == (2e-2, "0", "spp")
    assert later[1][2]["adapter_dir"] == f"{tmp_path}/rerun/nm2_4/spp/adapter"
    assert "trainer.resume_from" not in later[2][2] and later[2][2]["export.merged"] == "true"
    _trained_here(tmp_path / "grid/nm2_4/spp/lr2e-2", tmp_path / "grid/nm2_4/masked_full/lr1e-3")
    here = jobs()
    assert [(s, d) for s, d, _ in here] == [("eval.py", "zero_shot/nm2_4/spp"),
                                            ("train.py", "export/nm2_4/masked_full"),
                                            ("eval.py", "zero_shot/nm2_4/masked_full")]
    assert here[0][2]["adapter_dir"] == f"{tmp_path}/grid/nm2_4/spp/lr2e-2/adapter"
    assert here[1][2]["trainer.resume_from"] == f"{tmp_path}/grid/nm2_4/masked_full/lr1e-3/checkpoints/last.ckpt"
    for m in ("spp", "masked_full"):
        (tmp_path / "zero_shot/nm2_4" / m).mkdir(parents=True)
        (tmp_path / "zero_shot/nm2_4" / m / "results.json").write_text("{}")
    assert jobs() == []

def _compose(script: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lab.plan import compose_job
    from spp.eval.job_config import register_eval_schema as register_eval
    from spp.paths import CONF_DIR

    if script == "train.py":
        return compose_job(overrides)
    register_eval()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=overrides)
    OmegaConf.resolve(cfg)
    OmegaConf.to_object(cfg)  # the typed eval job: out-of-range values fail here
    return cfg


@pytest.mark.slow  # composes every chunk's jobs (24 s loaded); CI runs it
def test_every_chunk_composes_with_the_headline_settings_at_the_chosen_rates(tmp_path: Path):
    """The runner's jobs, from a synthetic set of Wanda 2:4 grids, compose into typed train.py / eval.py jobs with
    the headline settings, the rate each grid chose and the seeds, objective and curve of their chunk."""
    best = {"spp": 2e-2, "lora": 1e-2, "sparse_lora": 1e-2, "scale_lora": 3e-2, "masked_full": 1e-3, "norms": 3e-3}
    for m, lr in best.items():
        ladder = selection.ladder_of([lr])
        for name in (selection.neighbour(lr, ladder, up=False), "{}e{}".format(*selection.mantissa_exponent(lr)),
                     selection.neighbour(lr, ladder, up=True)):
            write_train(tmp_path, f"grid/nm2_4/{m}/lr{name}", m, float(name), 0, 0.0, 0.0 if float(name) == lr else 0.3)
    _trained_here(tmp_path / "grid/nm2_4/lora/lr1e-2", tmp_path / "grid/nm2_4/masked_full/lr1e-3")
    jobs = _dry_jobs(tmp_path, "seeds spp nm2_4", "seeds masked_full nm2_4", "zero_shot lora nm2_4",
                     "zero_shot masked_full nm2_4", "reference nm2_4", "distill masked_full", "recovery spp",
                     "recovery_check lora", "grid spp unstructured75")
    by_dir = {Path(d).relative_to(tmp_path).as_posix(): (s, _compose(s, o)) for s, d, o in jobs}
    assert sorted(by_dir) == sorted([
        "seeds/nm2_4/spp/s1", "seeds/nm2_4/spp/s2", "seeds/nm2_4/masked_full/s1", "seeds/nm2_4/masked_full/s2",
        "zero_shot/nm2_4/lora", "export/nm2_4/masked_full", "zero_shot/nm2_4/masked_full", "reference/dense",
        "reference/nm2_4", "distill/nm2_4/masked_full/s0", "distill/nm2_4/masked_full/s1",
        "distill/nm2_4/masked_full/s2", "recovery/nm2_4/spp", "recovery_check/nm2_4/lora",
        "grid/unstructured75/spp/lr1e-2", "grid/unstructured75/spp/lr2e-2", "grid/unstructured75/spp/lr5e-2"])
    # (unstructured 75 %: the three points centred on SPP's settled Wanda 2:4 choice, 2e-2, not its base grid)
    for rel, (script, cfg) in by_dir.items():
        if script == "train.py":
            assert (cfg.data.max_examples, cfg.data.val_size, cfg.data.train_batch_size) == (540, 40, 8), rel
            assert (cfg.eval.seqlen, cfg.eval.max_windows, cfg.eval.window_sampling) == (512, 40, "systematic")
            assert list(cfg.eval.extra_ppl_sources) == ["wikitext2_val"] and cfg.seed == cfg.data.seed
            assert cfg.trainer.max_epochs == (2 if rel.startswith("recovery") else 1)
            assert cfg.trainer.curve_every_n_steps == (16 if rel.startswith("recovery") else None)
            assert cfg.objective.name == ("distill" if rel.startswith("distill") else "ce")
            if not rel.startswith("grid"):
                assert cfg.trainer.lr == best[cfg.adapter.name], rel
            exporting = rel.startswith("export")  # masked full FT: its chosen run resumed at its end, exported
            assert cfg.export.merged == exporting and bool(cfg.trainer.resume_from) == exporting, rel
            assert cfg.seed == (int(rel[-1]) if rel[-2:-1] == "s" else 0)
        elif rel == "zero_shot/nm2_4/masked_full":  # the export scored as a saved folder, nothing pruned or adapted
            assert cfg.model.path.endswith("export/nm2_4/masked_full/merged")
            assert (cfg.pruner.name, cfg.sparsity.name, cfg.adapter_dir) == ("none", "dense", None)
            assert cfg.data_dir == "data" and cfg.eval.log_samples and list(cfg.eval.tasks) == ["spp_zeroshot"]
        else:
            assert cfg.data_dir == "data" and cfg.eval.log_samples and list(cfg.eval.tasks) == ["spp_zeroshot"]
            assert cfg.eval.limit == 200 and list(cfg.eval.extra_ppl_sources) == ["wikitext2_val"]
            trains = [c for s, c in by_dir.values() if s == "train.py"]
            same = next((c for c in trains if c.sparsity.name == cfg.sparsity.name), None)
            groups = ("model", "calibration", "sparsity", "pruner") if same else ("model",)
            for group in groups:  # the pruning cache gives the model each run trained on
                assert cfg[group] == (same or trains[0])[group], f"{rel}: eval.py's {group} differs from train.py's"
    assert by_dir["zero_shot/nm2_4/lora"][1].adapter_dir.endswith("grid/nm2_4/lora/lr1e-2/adapter")
    assert by_dir["export/nm2_4/masked_full"][1].trainer.resume_from.endswith(
        "grid/nm2_4/masked_full/lr1e-3/checkpoints/last.ckpt")
    assert by_dir["reference/dense"][1].pruner.name == "none"
    assert by_dir["grid/unstructured75/spp/lr5e-2"][1].sparsity.name == "unstructured75"


def test_machine_record_names_the_cpu_capability(tmp_path: Path):
    import torch

    assert cli(["machine", str(tmp_path), "--load-start", "1.5"]) == 0
    rec = json.loads((tmp_path / "machine.json").read_text())
    assert rec["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and rec["load_1m_start"] == 1.5
    assert rec["cores"] >= 1 and rec["torch"] == torch.__version__ and "note" not in rec


def test_zero_shot_report_checks_the_scored_model_is_the_trained_one():
    """The zero-shot table's last column: eval.py's test PPL equals the training run's (dense/pruned references of
    the setting, else the chosen run's merged model) or both numbers are shown
    (with their relative difference up to another CPU's kernels' 5e-5, in bold past it); negative control: a 1e-4
    mismatch; a scored model that is another grid point of the method is named."""
    run = SimpleNamespace(test={"ppl": 94.12345}, dense_test={"ppl": 28.44}, pruned_test={"ppl": 208.91}, lr=2e-2)
    other = SimpleNamespace(test={"ppl": 99.5}, lr=5e-2)  # a grid point not chosen (the rate moved after scoring)
    chosen = {("nm2_4", "spp"): SimpleNamespace(chosen=run, grid=(run, other))}

    def ev(method: str, ppl: float | None) -> SimpleNamespace:
        return SimpleNamespace(method=method, ppl={} if ppl is None else {"wikitext2": {"ppl": ppl}})

    assert same_model(ev("spp", 94.12345 * (1 + 1e-8)), "nm2_4", chosen) == "94.12 (=)"
    assert same_model(ev("dense", 28.44), "nm2_4", chosen) == "28.44 (=)"
    assert same_model(ev("pruned", 208.91), "nm2_4", chosen) == "208.91 (=)"
    assert same_model(ev("dense", 28.44 * (1 + 8e-6)), "nm2_4", chosen) == "28.44 (run: 28.44, rel. diff 8e-06)"
    assert same_model(ev("spp", 94.12345 * (1 + 1e-4)), "nm2_4", chosen) == "94.13 (**run: 94.12**)"
    assert same_model(ev("lora", 95.0), "nm2_4", chosen) == "95.00 (no run)"
    assert same_model(ev("spp", 99.5), "nm2_4", chosen) == "99.50 (**= the lr 5e-2 seed-0 run, not the chosen rate's**)"
    assert same_model(ev("spp", None), "nm2_4", chosen) == "–"


def test_a_grid_point_not_started_ends_the_grid_instead_of_looping(tmp_path: Path):
    """STOP_AT reached with SPP's grid half done (one point of three): the runner skips the other two and returns; it
    must not extend an incomplete grid, nor propose the skipped point again forever (it did: stop 42's stream spun
    on `not starting .../lora/lr1e-2`). Then the base grid finished at an endpoint (1e-2): the extension 5e-3 is
    proposed once, skipped, and the runner returns (the old runner timed out here)."""
    write_train(tmp_path, "grid/nm2_4/spp/lr1e-2", "spp", 1e-2, 0, 0.0, 0.0)
    out = _runner(tmp_path, "grid spp nm2_4", STOP_AT="00:00", JOB_MINUTES="38")
    skipped = [line for line in out.splitlines() if "not starting" in line]
    assert [line.split("not starting ")[1].split(":")[0].rsplit("/", 1)[1] for line in skipped] == [
        "lr2e-2", "lr5e-2", "lr1e-1"], out
    for name, val in (("lr2e-2", 0.1), ("lr5e-2", 0.2), ("lr1e-1", 0.3)):
        write_train(tmp_path, f"grid/nm2_4/spp/{name}", "spp", float(name[2:]), 0, 0.0, val)
    out = _runner(tmp_path, "grid spp nm2_4", STOP_AT="00:00", JOB_MINUTES="38")
    skipped = [line for line in out.splitlines() if "not starting" in line]
    assert len(skipped) == 1 and "/grid/nm2_4/spp/lr5e-3:" in skipped[0], out  # 1e-2 chosen: extends once
