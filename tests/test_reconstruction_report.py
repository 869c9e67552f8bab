"""The reconstruction campaign's report and figure (``python -m lab.reconstruction report|figure``) on a
synthetic campaign written in the runner's raw layout (``experiments/reconstruction/run.sh``): selection on validation
only, the epochs grid, gap closed per CPU-minute against an independent formula (the end-to-end curve offset by the
reconstruction's CPU time, a cache hit's original time), the seeds' t interval, the machine, a partial campaign, and
the committed report and figure data regenerating byte for byte."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest

from lab.reconstruction.__main__ import main as cli
from lab.reconstruction.figure import figure_data
from lab.reconstruction.grids import BASE_RATES, choices, rate_grids
from lab.reconstruction.records import load
from lab.reconstruction.report import report
from lab.reconstruction.seeds import T_975, t_interval
from lab.recovery.recovery import minutes_to

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = 40
BASE = np.random.default_rng(11).normal(5.5, 0.3, WINDOWS)  # a shared per-window difficulty
MACHINE = {"cpu_model": "Test CPU", "cpu_capability": "AVX512", "cores": 2, "omp_num_threads": 1,
           "torch": "2.13.0+cpu", "load_1m_start": 1.0, "load_1m_end": 2.0}


def entry(shift: float, source: str = "wikitext2", noise: float = 0.0, seed: int = 0) -> dict:
    """A perplexity entry whose per-window NLL is ``BASE + shift`` (+ optional noise)."""
    nll = BASE + shift + (np.random.default_rng(seed).normal(0, noise, WINDOWS) if noise else 0.0)
    ppl = float(np.exp(nll.mean()))
    return {"ppl": ppl, "nll_mean": float(nll.mean()), "seqlen": 512, "windows": WINDOWS, "source": source,
            "window_nll": [float(v) for v in nll], "window_starts": list(range(0, 512 * WINDOWS, 512)),
            "ci_low": ppl * 0.9, "ci_high": ppl * 1.1}


def write_reference(root: Path, pruned: tuple[tuple[str, float], ...] = (("dense", -1.5), ("nm2_4", 0.0))) -> None:
    """``eval.py`` references: dense at BASE - 1.5, Wanda 2:4 pruned at BASE, on test and validation windows."""
    for name, shift in pruned:
        (root / "reference" / name).mkdir(parents=True)
        record = {"ppl": {"wikitext2": entry(shift), "wikitext2_val": entry(shift, "wikitext2_val")}, "tasks": {},
                  "info": {"timings": {"prune": 60.0, "ppl_wikitext2": 120.0, "ppl_wikitext2_val": 180.0}}}
        (root / "reference" / name / "results.json").write_text(json.dumps({"records": [record]}))
        (root / "reference" / name / "machine.json").write_text(json.dumps(MACHINE))


def write_run(root: Path, rel: str, *, form: str | None, lr: float = 0.1, epochs: int = 3, seed: int = 0,
              test: float = 0.0, val: float = 0.0, cpu_s: float = 300.0, hit: bool = False,
              curve: list[tuple[float, float]] | None = None, noise: float = 0.0,
              sparsity: str = "nm2_4", pruned: float = 0.0) -> Path:
    """A ``train.py`` ``summary.json``: merged test NLL ``BASE + test`` (+ seed noise), validation ``BASE + val``, a
    reconstruction of ``cpu_s`` CPU seconds (stored as the original run's on a cache ``hit``), and optionally a
    recovery curve of ``(train_cpu_s, validation shift)`` points every 16 steps."""
    run_dir = root / rel
    run_dir.mkdir(parents=True)
    timings = {"total": cpu_s, "original": {"cpu_seconds": cpu_s}} if hit else {"total": cpu_s, "cpu_seconds": cpu_s}
    recon = None if form is None else {"blocks": [{"block": 0, "loss_start": 2.0, "loss_end": 1.0}],
                                       "timings": timings, "cache_hit": hit}
    data = {"run": {"pruner": "wanda", "sparsity": sparsity, "adapter": "none" if curve is None else "spp"},
            "config": {"seed": seed, "trainer": {"lr": 0.02},
                       "reconstruct": {"name": "none"} if form is None else
                       {"name": "blockwise", "form": form, "lr": lr, "epochs": epochs}},
            "perplexity": {"dense": entry(-1.5), "pruned": entry(pruned),
                           "merged": entry(test, noise=noise, seed=seed)},
            "merged_ppl_by_source": {"wikitext2_val": entry(val, "wikitext2_val")}, "reconstruction": recon,
            "timings": {"total": 600.0},
            "recovery_curve": [{**entry(s, "wikitext2_val"), "step": 16 * k, "train_cpu_s": t}
                               for k, (t, s) in enumerate(curve)] if curve else None}
    (run_dir / "summary.json").write_text(json.dumps(data))
    (run_dir / "machine.json").write_text(json.dumps(MACHINE))
    return run_dir


def write_campaign(root: Path) -> None:
    """SPP form: rates 3e-2, 1e-1, 3e-1 (val best at 1e-1, test best at 3e-2), 5 CPU-min each; epochs 1, 2, 5 at 1e-1
    (5 epochs best, 12 CPU-min); seeds 1, 2 at (1e-1, 5 ep.). Masked full: base grid best at the top (3e-4), extended
    by 1e-3 (worse): interior. Norms: two of three points. SPP end to end alone: 0.3 nats every 300 CPU-s, then
    0.36; the reconstruction (cache hit, 720 CPU-s originally) then SPP end to end: from 0.6 nats, 0.3 every 300
    CPU-s."""
    write_reference(root)
    for lr, test, val in ((3e-2, -0.6, -0.3), (1e-1, -0.4, -0.45), (3e-1, -0.2, -0.15)):
        write_run(root, f"grid/nm2_4/spp/e3/lr{lr:g}", form="spp", lr=lr, test=test, val=val)
    for e, val in ((1, -0.2), (2, -0.4), (5, -0.6)):
        write_run(root, f"epochs/nm2_4/spp/lr0.1/e{e}", form="spp", epochs=e, test=val, val=val, cpu_s=144.0 * e,
                  noise=0.05)
    for s in (1, 2):
        write_run(root, f"seeds/nm2_4/spp/lr0.1/e5/s{s}", form="spp", epochs=5, seed=s, test=-0.6 + 0.05 * s,
                  val=-0.6, cpu_s=720.0, noise=0.05)
    for lr, val in ((3e-5, -0.1), (1e-4, -0.2), (3e-4, -0.3), (1e-3, -0.25)):
        write_run(root, f"grid/nm2_4/masked_full/e3/lr{lr:g}", form="masked_full", lr=lr, test=val, val=val,
                  cpu_s=900.0)
    for lr, val in ((1e-3, -0.05), (3e-3, -0.1)):
        write_run(root, f"grid/nm2_4/norms/e3/lr{lr:g}", form="norms", lr=lr, test=val, val=val, cpu_s=60.0)
    write_run(root, "e2e/nm2_4/spp", form=None, test=-0.7, val=-0.9,
              curve=[(0.0, 0.0), (300.0, -0.3), (600.0, -0.6), (900.0, -0.96)])
    write_run(root, "then_e2e/nm2_4/spp/lr0.1/e5", form="spp", epochs=5, hit=True, cpu_s=720.0, test=-0.9, val=-1.2,
              curve=[(300.0 * k, -0.6 - 0.3 * k) for k in range(3)])


@pytest.fixture()
def campaign(tmp_path: Path) -> Path:
    write_campaign(tmp_path / "c")
    return tmp_path / "c"


def section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


def rows_of(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(start)]


def test_selection_is_on_validation_and_grids_say_interior(campaign: Path):
    """SPP's rate grid chooses 1e-1 (best validation; test would pick 3e-2: the negative control), then 5 epochs on the
    epochs grid, an endpoint; masked full FT's extension makes 3e-4 interior; norms has 2 of its 3 base points."""
    text = report(campaign)
    grids = section(text, "Grids")
    spp = rows_of(grids, "| Wanda 2:4 | SPP | 3 |")[0]
    assert f"| 3e-2: {math.exp(BASE.mean() - 0.3):.2f}, 1e-1: **{math.exp(BASE.mean() - 0.45):.2f}**, 3e-1: " in spp
    assert "| 1e-1 | yes |" in spp and "| 5 | **no: endpoint** |" in spp
    assert f"1: {math.exp(BASE.mean() - 0.2):.2f}, 2: {math.exp(BASE.mean() - 0.4):.2f}, 3: " in spp
    masked = rows_of(grids, "| Wanda 2:4 | masked full FT | 3 |")[0]
    assert "| 3e-4 | yes |" in masked and "1e-3: " in masked and "| not run | – | – |" in masked
    assert "| not finished: 2 of 3 base points |" in rows_of(grids, "| Wanda 2:4 | norms only | 3 |")[0]
    chosen = {ch.form: ch.chosen for ch in choices(load(campaign))}
    assert (chosen["spp"].lr, chosen["spp"].epochs) == (0.1, 5) and chosen["masked_full"].lr == 3e-4
    grid = next(g for g in rate_grids(load(campaign)) if g.form == "spp")
    assert min(grid.runs, key=lambda r: r.test["ppl"]).lr == 3e-2  # the test split would have chosen otherwise


def test_a_finished_grid_at_an_endpoint_names_its_extension(tmp_path: Path):
    for lr, val in ((3e-2, -0.1), (1e-1, -0.2), (3e-1, -0.3)):
        write_run(tmp_path, f"grid/nm2_4/spp/e3/lr{lr:g}", form="spp", lr=lr, val=val)
    assert "| 3e-1 | **no: endpoint** (lr 1e0 not run) |" in report(tmp_path)


def test_a_shorter_check_reads_against_its_own_setting(campaign: Path, capsys):
    """A ``check/`` run (Wanda 2:4's choice at unstructured 50 %, pruned at BASE - 0.9): gap closed against that
    setting's pruned model, (−0.9 + 1.2) / (−0.9 + 1.5) = 50 % on validation, (−0.9 + 1.05) / 0.6 = 25 % on test; no
    grid row for it; ``pick`` prints the Wanda 2:4 choice (the runner's ``check`` step reads it) and that run."""
    write_reference(campaign, (("unstructured50", -0.9),))
    write_run(campaign, "check/unstructured50/spp/lr0.1/e5", form="spp", epochs=5, sparsity="unstructured50",
              pruned=-0.9, test=-1.05, val=-1.2, cpu_s=720.0)
    text = report(campaign)
    assert "1 then_e2e, 1 check training jobs" in text
    assert not rows_of(section(text, "Grids"), "| Wanda unstructured 50 % |")
    row = rows_of(section(text, "Recovery per CPU-minute"), "| Wanda unstructured 50 % |")[0]
    assert row.startswith("| Wanda unstructured 50 % | SPP form, lr 1e-1, 5 ep. | 12.0 | 50.0 [50.0, 50.0] at 12.0 |")
    test_row = rows_of(section(text, "Test perplexity"), "| Wanda unstructured 50 % | SPP form")[0]
    assert "| 25.0 [25.0, 25.0] |" in test_row
    assert "- Wanda 2:4: best two" in text and "- Wanda unstructured 50 %: best two" not in text  # nothing to rank
    for setting in ("nm2_4", "unstructured50"):
        assert cli(["pick", str(campaign), "--setting", setting, "--form", "spp"]) == 0
        assert capsys.readouterr().out == "0.1 5\n"
    assert cli(["pick", str(campaign), "--setting", "unstructured75", "--form", "spp"]) == 2


def test_runner_queries(campaign: Path, tmp_path: Path, capsys):
    """``extend`` prints the rate past a chosen endpoint and nothing for an interior grid; ``chosen`` prints the
    chosen rate, and fails (status 2, one line) on a grid with no finished point, so the runner skips the step
    instead of running ``reconstruct.lr=`` (empty)."""
    for lr, val in ((3e-2, -0.1), (1e-1, -0.2), (3e-1, -0.3)):
        write_run(tmp_path, f"grid/nm2_4/spp/e3/lr{lr:g}", form="spp", lr=lr, val=val)
    assert cli(["extend", str(tmp_path / "grid/nm2_4/spp/e3")]) == 0 and capsys.readouterr().out == "1\n"
    assert cli(["extend", str(campaign / "grid/nm2_4/masked_full/e3")]) == 0 and capsys.readouterr().out == ""
    assert cli(["chosen", str(campaign / "grid/nm2_4/masked_full/e3")]) == 0 and capsys.readouterr().out == "0.0003\n"
    assert cli(["chosen", str(tmp_path / "grid/nm2_4/norms/e3")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_recovery_reads_gap_per_cpu_minute_against_the_formula(campaign: Path):
    """Validation gap closed = shift / 1.5 (dense at BASE - 1.5, pruned at BASE). SPP form chosen at 5 epochs:
    0.6 / 1.5 = 40 % at 12 CPU-min, 20 points short; masked full FT 20 % at 15.0 min; SPP end to end 40 % at 10 and
    64 % at 15 CPU-min: 60 % at 10 + 5 · 20 / 24 min; the reconstruction then SPP end to end starts at 12 CPU-min (the
    cache hit's original CPU time) at 40 %, 60 % at 17 min: past the budget (negative control: without the offset it
    would reach it at 5 min). At 12 CPU-min SPP end to end is at BASE - 0.6 - 0.36 · 2 / 5, so the SPP form's
    validation PPL over it is exp(0.144)."""
    text = section(report(campaign), "Recovery per CPU-minute")
    rows = {r.split(" | ")[1]: r for r in rows_of(text, "| Wanda 2:4 |")}
    spp = rows["SPP form, lr 1e-1, 5 ep."]
    assert "| 12.0 | 40.0 [40.0, 40.0] at 12.0 | no: 20.0 points short |" in spp
    r = f"{math.exp(0.144):.3f}"
    assert spp.endswith(f"| {r} [{r}, {r}] |")
    assert "| 15.0 | 20.0 [20.0, 20.0] at 15.0 | no: 40.0 points short |" in rows["masked full FT form, lr 3e-4, 3 ep."]
    assert f"| – | 64.0 [64.0, 64.0] at 15.0 | **yes** ({10 + 5 * 20 / 24:.1f} min) |" in rows["SPP end to end alone"]
    then = rows["SPP form, lr 1e-1, 5 ep. then SPP end to end"]
    assert "| 12.0 | 40.0 [40.0, 40.0] at 12.0 | no: 20.0 points short | 80.0 [80.0, 80.0] at 22.0 | 17.0 |" in then
    assert "| 1.0 | 6.7 [6.7, 6.7] at 1.0 | no: 53.3 points short |" in rows["norms only form, lr 3e-3, 3 ep."]
    data = figure_data(campaign)
    then_curve = next(c for c in data["curves"] if c["kind"] == "then_e2e")
    assert [p["cpu_min"] for p in then_curve["points"]] == pytest.approx([12.0, 17.0, 22.0])
    assert [p["gap"] for p in then_curve["points"]] == pytest.approx([0.4, 0.6, 0.8])
    unshifted = [{**p, "cpu_min": p["cpu_min"] - 12.0} for p in then_curve["points"]]
    assert minutes_to(unshifted, 0.6) == pytest.approx(5.0)  # the negative control: the offset is what moves it
    assert sorted(p["gap"] for p in data["points"] if p["form"] == "SPP") == pytest.approx(
        sorted(s / 1.5 for s in (0.3, 0.45, 0.15, 0.2, 0.4, 0.6)), abs=1e-6)  # rounded to 6 digits


def test_test_table_pairs_each_chosen_run_with_pruned_and_end_to_end(campaign: Path):
    """Masked full FT (test NLL BASE - 0.3, no noise): PPL / pruned = exp(-0.3) exactly, over SPP end to end's final
    (BASE - 0.7) exp(0.4); gap closed on test 0.3 / 1.5. The reconstruction then SPP end to end's CPU time is 12 + 10
    CPU-min."""
    text = section(report(campaign), "Test perplexity of the chosen settings")
    rows = {r.split(" | ")[1]: r for r in rows_of(text, "| Wanda 2:4 |")}
    a, b = f"{math.exp(-0.3):.3f}", f"{math.exp(0.4):.3f}"
    masked = rows["masked full FT form, lr 3e-4, 3 ep."]
    assert f"| 20.0 [20.0, 20.0] | {a} [{a}, {a}] |" in masked and masked.endswith(f"| {b} [{b}, {b}] |")
    assert rows["SPP form, lr 1e-1, 5 ep. then SPP end to end"].startswith(
        "| Wanda 2:4 | SPP form, lr 1e-1, 5 ep. then SPP end to end | 22.0 |")
    assert f"| {math.exp(BASE.mean() - 1.5):.2f} [" in rows["dense"]
    assert "best two on validation PPL (the runner's `seeds` step): SPP form, lr 1e-1, 5 ep. (" in text
    assert "; masked full FT form, lr 3e-4, 3 ep. (" in text


def test_seed_t_interval_matches_scipy_and_the_formula(campaign: Path):
    """The t quantiles equal scipy's; the seeds row's mean and interval follow mean ± t(0.975, 2) · sd / √3 of the
    three seeds' test perplexities (seed 0 = the chosen epochs point)."""
    stats = pytest.importorskip("scipy.stats")
    assert T_975 == pytest.approx([stats.t.ppf(0.975, d) for d in range(1, 11)], abs=1e-6)
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert (mean, high - mean) == pytest.approx((2.0, 4.302653 / math.sqrt(3)))
    with pytest.raises(ValueError, match="2 to 11"):
        t_interval([1.0])
    ppl = [entry(-0.6 + 0.05 * s, noise=0.05, seed=s)["ppl"] for s in (0, 1, 2)]
    m, half = statistics.mean(ppl), 4.302653 * statistics.stdev(ppl) / math.sqrt(3)
    row = rows_of(section(report(campaign), "Seeds"), "| Wanda 2:4 | SPP |")[0]
    assert f"| 0,1,2 | {', '.join(f'{v:.2f}' for v in ppl)} | {m:.2f} [{m - half:.2f}, {m + half:.2f}] |" in row
    assert row.endswith("| yes |")


def test_seeds_whose_choice_moved_say_so(campaign: Path):
    """Seeds that ran at the chosen epochs stay in the table when a longer epochs point wins later; the row names the
    new choice, which has its seed 0 only (negative control: before that run the row says yes)."""
    write_run(campaign, "epochs/nm2_4/spp/lr0.1/e10", form="spp", epochs=10, test=-0.7, val=-0.7, cpu_s=1440.0)
    text = report(campaign)
    row = rows_of(section(text, "Seeds"), "| Wanda 2:4 | SPP |")[0]
    assert "| 1e-1 | 5 | 0,1,2 |" in row and row.endswith("| **no: 10 ep. at lr 1e-1 (its seed 0 only)** |")
    assert choices(load(campaign))[0].chosen.epochs == 10 and len(choices(load(campaign))[0].seeds) == 1
    for s in (1, 2):  # the new choice's own seeds: both rows listed, the older one points at them
        write_run(campaign, f"seeds/nm2_4/spp/lr0.1/e10/s{s}", form="spp", epochs=10, test=-0.7, val=-0.7,
                  cpu_s=1440.0, seed=s)
    rows = rows_of(section(report(campaign), "Seeds"), "| Wanda 2:4 | SPP |")
    assert rows[0].endswith("| **no: 10 ep. at lr 1e-1 (its seeds: in this table)** |") and rows[1].endswith("| yes |")


def test_a_choice_past_the_budget_lists_the_best_within_it(campaign: Path):
    """The chosen 10 epochs took 24 CPU-min (> 15): the best on validation within 15 CPU-min (5 epochs, 12 min; not
    the 1 or 2 epochs, worse on validation) is listed in the recovery and test tables too; before, nothing extra."""
    def spp_rows(text: str, title: str) -> list[str]:
        return [r for r in rows_of(section(text, title), "| Wanda 2:4 | SPP form, lr 1e-1, ") if "then" not in r]

    assert [r.split(" | ")[1] for r in spp_rows(report(campaign), "Test perplexity")] == ["SPP form, lr 1e-1, 5 ep."]
    write_run(campaign, "epochs/nm2_4/spp/lr0.1/e10", form="spp", epochs=10, test=-0.7, val=-0.7, cpu_s=1440.0)
    text = report(campaign)
    for title in ("Test perplexity", "Recovery per CPU-minute"):
        assert [r.split(" | ")[1] for r in spp_rows(text, title)] == ["SPP form, lr 1e-1, 10 ep.",
                                                                     "SPP form, lr 1e-1, 5 ep."]
    within = spp_rows(text, "Recovery per CPU-minute")[1]
    assert within.split(" | ")[2] == "12.0" and "no: " in within.split(" | ")[4]


def test_machine_and_partial_campaign(tmp_path: Path):
    """A campaign with the references only, one grid point running and one failed: every section says so instead
    of failing; the machine table reads machine.json."""
    write_reference(tmp_path)
    (tmp_path / "grid/nm2_4/spp/e3").mkdir(parents=True)
    (tmp_path / "grid/nm2_4/spp/e3/lr0.03.running.log").write_text("")
    (tmp_path / "grid/nm2_4/spp/e3/lr0.1.failed.log").write_text("")
    text = report(tmp_path)
    assert "Not finished: `grid/nm2_4/spp/e3/lr0.03` (running), `grid/nm2_4/spp/e3/lr0.1` (failed)." in text
    assert "No rate grid has finished yet." in text and text.count("Not run yet") == 2
    assert "| Test CPU (AVX512) | 2 | 1 | 2 | 2.13.0+cpu | 1.00–1.00 | 2.00–2.00 |" in text
    assert "| Wanda 2:4 | pruned | – | – |" in text
    assert cli(["figure", str(tmp_path), "--out", str(tmp_path / "f.png")]) == 2  # nothing to draw: one line
    assert cli(["report", str(tmp_path / "missing")]) == 2


def test_runner_rates_are_the_report_base_grids():
    """``rates()`` of the runner and :data:`BASE_RATES` agree (the report counts a grid's base points with them)."""
    script = (ROOT / "experiments/reconstruction/run.sh").read_text()
    body = script.split("rates() {")[1].split("esac")[0]
    found = {m: tuple(float(v) for v in rates.split()) for m, rates in re.findall(r'(\w+)\) echo "([^"]+)"', body)}
    assert found == BASE_RATES


def test_report_and_figure_regenerate_byte_for_byte_wherever_the_campaign_lies(campaign: Path, tmp_path: Path):
    """The committed-file path: write report and figure with the command line, copy the raw tree elsewhere, and
    regenerate both from the copy: identical bytes (no absolute path or run-order dependence in the outputs)."""
    md, png = tmp_path / "out/report.md", tmp_path / "out/fig.png"
    assert cli(["report", str(campaign), "--out", str(md)]) == 0
    assert cli(["figure", str(campaign), "--out", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    moved = tmp_path / "elsewhere/reconstruction"
    shutil.copytree(campaign, moved)
    assert report(moved) == md.read_text()
    assert json.dumps(figure_data(moved), indent=1) + "\n" == png.with_suffix(".json").read_text()
    assert str(tmp_path) not in md.read_text() + png.with_suffix(".json").read_text()


COMMITTED = ROOT / "experiments/results/runs/reconstruction"
REPORT = ROOT / "experiments/results/reconstruction_smollm2_135m.md"
FIGURE_DATA = ROOT / "experiments/results/figures/reconstruction_smollm2_135m.json"


@pytest.mark.skipif(not REPORT.is_file(), reason="no committed reconstruction report yet")
def test_committed_reconstruction_report_regenerates_byte_identically():
    assert report(COMMITTED) == REPORT.read_text()


@pytest.mark.skipif(not FIGURE_DATA.is_file(), reason="no committed reconstruction figure yet")
def test_committed_reconstruction_figure_data_regenerates_byte_identically():
    assert json.dumps(figure_data(COMMITTED), indent=1) + "\n" == FIGURE_DATA.read_text()
