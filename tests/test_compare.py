"""``python -m spp.compare``: a sweep's table keyed by the keys that differ between its runs, as Markdown and CSV,
and a metric drawn against one of them; plain job-folder names for a multirun (``spp.compare.naming``).

The slow tests run one real 2 x 2 multirun of the tiny model (``experiment=tiny_smoke adapter.r=4,8
sparsity=unstructured50,nm2_4 logger=[csv]``, a module fixture) and check the folder names, the command's table
against the runs' ``summary.json`` and the notebook on that sweep; the fast ones use written summaries."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spp.compare.naming import sweep_job_name
from spp.compare.runs import find_runs, swept_keys
from spp.compare.table import compare_rows, markdown_table
from spp.errors import UserError
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
SWEEP_ARGS = ["-m", "experiment=tiny_smoke", "adapter.r=4,8", "sparsity=unstructured50,nm2_4", "logger=[csv]",
              f"data_dir={SAMPLE_DATA_DIR}"]
JOBS = ["0_adapter.r-4_sparsity-unstructured50", "1_adapter.r-4_sparsity-nm2_4",
        "2_adapter.r-8_sparsity-unstructured50", "3_adapter.r-8_sparsity-nm2_4"]


def compare(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spp.compare", *map(str, args)], cwd=REPO_ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """The 2 x 2 multirun of the tiny model: ``hydra.sweep.dir`` with four job folders."""
    root = tmp_path_factory.mktemp("sweep")
    proc = subprocess.run([sys.executable, "train.py", *SWEEP_ARGS, f"cache_dir={root / 'cache'}",
                           f"hydra.sweep.dir={root / 'multirun'}"], cwd=REPO_ROOT, env=ENV, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "multirun"


@pytest.mark.slow
def test_multirun_folder_names_are_plain(sweep):
    names = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert names == JOBS  # logger=[csv] and the cache_dir/data_dir paths are left out of the names
    assert not any(set(name) & set("[],=") for name in names)
    overrides = yaml.safe_load((sweep / JOBS[1] / ".hydra" / "overrides.yaml").read_text())
    assert "logger=[csv]" in overrides and "adapter.r=4" in overrides  # the config still records them


@pytest.mark.slow
def test_compare_prints_the_table_keyed_by_the_swept_keys(sweep, tmp_path):
    out = tmp_path / "out"
    proc = compare(sweep, "--x", "adapter.r", "--out", out)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"4 runs under {sweep}; swept: adapter.r, sparsity"
    table = [line for line in lines if line.startswith("| ")]
    assert table[0].startswith("| adapter.r | sparsity | ppl [95 % interval] |")
    assert [row.split(" | ")[:2] for row in table[1:]] == [
        ["| 4", "unstructured50"], ["| 4", "nm2_4"], ["| 8", "unstructured50"], ["| 8", "nm2_4"]]
    with open(out / "compare.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == JOBS
    for row in rows:
        summary = json.loads((sweep / row["run"] / "summary.json").read_text())
        merged = summary["perplexity"]["merged"]
        assert row["adapter.r"] == str(summary["config"]["adapter"]["r"])
        assert row["sparsity"] == summary["config"]["sparsity"]["name"]
        assert float(row["ppl"]) == merged["ppl"] and row["ppl_of"] == "merged"
        assert float(row["ppl_low"]) == merged["ci_low"] < merged["ppl"] < float(row["ppl_high"]) == merged["ci_high"]
        assert float(row["ppl_pruned"]) == summary["perplexity"]["pruned"]["ppl"]
        assert float(row["sparsity_after"]) == summary["sparsity"]["after"] == 0.5
        assert int(row["trainable_params"]) == summary["params"]["trainable"]
        assert float(row["time_s"]) == summary["timings"]["total"]
        assert f"{merged['ppl']:.2f} [{merged['ci_low']:.2f}, {merged['ci_high']:.2f}]" in proc.stdout
    assert int(rows[0]["trainable_params"]) < int(rows[2]["trainable_params"])  # r = 4 < r = 8
    assert (out / "compare.md").read_text().splitlines()[2:] == table[1:]
    _check_png(out / "compare_ppl_vs_adapter.r.png")


def _check_png(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.is_file(), path
    img = mpimg.imread(path)
    assert img.ndim == 3 and min(img.shape[:2]) >= 300
    assert float(img[..., :3].std()) > 0.02, f"{path.name} is blank"


@pytest.mark.slow
def test_results_notebook_runs_on_the_sweep(sweep, tmp_path):
    from test_notebook import execute_notebook

    text, images = execute_notebook({"SPP_RESULTS_DIR": str(sweep), "SPP_FIGURES_DIR": str(tmp_path / "figures")})
    assert "4 runs; swept: adapter.r, sparsity" in text
    assert "4 curves" in text  # one loss curve per run: the r ablation is drawn, not dropped
    assert "SPP runs whose sparsity after the merge equals the pruned model's: 4 of 4" in text
    assert images >= 4  # the sweep, (a), (b), (c) shown inline
    assert not (tmp_path / "figures").exists()  # nothing written unless SPP_SAVE_FIGURES=1


def test_multirun_folder_names_without_training(tmp_path):
    """Hydra names the job folders (``plan=true``: each job plans and exits, no weight read) from list overrides."""
    sweep = tmp_path / "plan"
    args = ["-m", "experiment=tiny_smoke", "adapter.r=4,8", "logger=[csv,wandb]", "eval.tasks=[arc_easy,boolq]",
            "plan=true", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO_ROOT, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert names == ["0_adapter.r-4_eval.tasks-arc_easy+boolq_plan-True",
                     "1_adapter.r-8_eval.tasks-arc_easy+boolq_plan-True"]
    overrides = yaml.safe_load((sweep / names[0] / ".hydra" / "overrides.yaml").read_text())
    assert "logger=[csv,wandb]" in overrides and "eval.tasks=[arc_easy,boolq]" in overrides  # recorded as typed


def _write_run(folder: Path, overrides: list[str], config: dict, ppl: float, trainable: int) -> None:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    merged = {"ppl": ppl, "ci_low": ppl - 1, "ci_high": ppl + 1}
    summary = {"run": {}, "config": config, "params": {"trainable": trainable},
               "perplexity": {"pruned": {"ppl": 2 * ppl}, "merged": merged},
               "sparsity": {"before": 0.5, "after": 0.5}, "losses": {"train_last": 1.5}, "timings": {"total": 3.0}}
    (folder / "summary.json").write_text(json.dumps(summary))


def _config(r: int, lr: float, sparsity: str = "nm2_4") -> dict:
    return {"seed": 0, "run_dir": "x", "adapter": {"name": "spp", "r": r}, "trainer": {"lr": lr},
            "sparsity": {"name": sparsity, "ratio": 0.5}}


def test_swept_keys_are_the_overrides_that_differ(tmp_path):
    for i, (r, lr) in enumerate([(4, 1e-3), (8, 1e-3), (16, 1e-3)]):
        _write_run(tmp_path / str(i), [f"adapter.r={r}", f"trainer.lr={lr}", f"cache_dir=/c{i}", "logger=[csv]"],
                   _config(r, lr), ppl=10.0 + i, trainable=100 * r)
    (tmp_path / "eval_only").mkdir()
    (tmp_path / "eval_only" / "summary.json").write_text('{"results": {}}')  # not a training run: skipped
    runs = find_runs(tmp_path)
    keys = swept_keys(runs)
    assert keys == ["adapter.r"]  # trainer.lr is the same everywhere; cache_dir differs but is where, not what
    rows = compare_rows(runs, keys)
    assert [(r["adapter.r"], r["ppl"], r["trainable_params"]) for r in rows] == [("4", 10.0, 400), ("8", 11.0, 800),
                                                                               ("16", 12.0, 1600)]
    assert "| 8 | 11.00 [10.00, 12.00] | 22.00 |" in markdown_table(rows, keys)


def test_without_overrides_the_config_differences_are_the_keys(tmp_path):
    _write_run(tmp_path / "a", [], _config(4, 1e-3, "nm2_4") | {"run_dir": "a"}, ppl=10.0, trainable=1)
    _write_run(tmp_path / "b", [], _config(4, 1e-4, "unstructured50") | {"run_dir": "b"}, ppl=11.0, trainable=1)
    assert swept_keys(find_runs(tmp_path)) == ["trainer.lr", "sparsity"]  # the group's keys folded into its name
    _write_run(tmp_path / "c", [], _config(4, 1e-3, "nm2_4"), ppl=12.0, trainable=1)
    assert swept_keys(find_runs(tmp_path / "c")) == []  # negative control: one run differs in nothing


def test_a_folder_without_runs_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no runs under"):
        find_runs(tmp_path / "empty")
    proc = compare(tmp_path / "empty")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"python -m spp.compare: error: no runs under {tmp_path / 'empty'} (no train.py summary.json below it) — give "
        "a train.py run folder or a multirun folder (e.g. multirun/<date>/<time>) that holds summary.json files"]


def test_an_unswept_x_is_one_line(tmp_path):
    for i, r in enumerate((4, 8)):
        _write_run(tmp_path / str(i), [f"adapter.r={r}"], _config(r, 1e-3), ppl=10.0 + i, trainable=r)
    proc = compare(tmp_path, "--x", "trainer.lr")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("python -m spp.compare: error: --x trainer.lr is not a swept key of these runs — "
                                   "use one of: adapter.r")
    proc = compare(tmp_path, "--metric", "trainable_params", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    _check_png(tmp_path / "out" / "compare_trainable_params_vs_adapter.r.png")
    proc = compare(tmp_path, "--no-figure", "--x", "adapter.r", "--out", tmp_path / "table_only")
    assert proc.returncode == 0, proc.stderr  # --x has nothing to place without a figure: not an error
    assert sorted(p.name for p in (tmp_path / "table_only").iterdir()) == ["compare.csv", "compare.md"]


def test_sweep_job_names_hold_no_glob_characters():
    task = ["experiment=tiny_smoke", "adapter.r=4", "logger=[csv,wandb]", "eval.tasks=[arc_easy,boolq]",
            "+trainer.note='a b'", "cache_dir=/tmp/c"]
    name = sweep_job_name(3, task, ["cache_dir", "logger", "experiment"])
    assert name == "3_adapter.r-4_eval.tasks-arc_easy+boolq_trainer.note-ab"
    assert sweep_job_name(0, ["logger=[csv]"], ["logger"]) == "0"
    # negative control: Hydra's own override_dirname of the same overrides holds what the name must not
    assert set(",".join(task)) & set("[],=") and not set(name) & set("[],=")
    long = sweep_job_name(1, [f"key{i}=value{i}" for i in range(40)])
    assert len(long) <= 120 and long != sweep_job_name(1, [f"key{i}=value{i}" for i in range(41)])
