"""``notebooks/results.ipynb`` executes top to bottom (nbclient, a real kernel): on the committed results (no
``merged/`` there; default suite) and on tiny ``train.py`` runs with merged exports, where its sparsity check finds
identical zero patterns before and after the merge and, asked with ``SPP_SAVE_FIGURES=1``, it saves four
non-trivial PNGs. Without that variable it writes nothing and shows its figures inline. ``tests/test_compare.py``
runs it on a 2 x 2 sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest

from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR

FIGURES = ("sweep_ppl.png", "ppl_zeroshot_bars.png", "loss_curves.png", "layer_sparsity.png",
           "nm_block_before_after.png")
NOTEBOOK_ENV = ("SPP_RESULTS_DIR", "SPP_SWEEP_DIR", "SPP_FIGURES_DIR", "SPP_SAVE_FIGURES")


@contextmanager
def _environment(env: dict[str, str]):
    """``os.environ`` (which the kernel inherits) with the notebook's variables set to ``env`` only."""
    saved = {k: os.environ.get(k) for k in (*NOTEBOOK_ENV, "OMP_NUM_THREADS")}
    for key in NOTEBOOK_ENV:
        os.environ.pop(key, None)
    os.environ.update({"OMP_NUM_THREADS": "1", **env})
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def execute_notebook(env: dict[str, str]) -> tuple[str, int]:
    """Execute the notebook with ``env``; its printed text and how many figures it showed inline."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(REPO_ROOT / "notebooks" / "results.ipynb", as_version=4)
    with _environment(env):
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(REPO_ROOT / "notebooks")}}).execute()
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    text = "\n".join(out.get("text", "") for out in outputs)
    images = sum("image/png" in out.get("data", {}) for out in outputs)
    return text, images


def test_results_notebook_runs_on_the_committed_results(tmp_path):
    """The committed results hold an r ablation (Table 6) and no ``merged/``: the notebook runs through."""
    text, images = execute_notebook({"SPP_FIGURES_DIR": str(tmp_path / "figures")})
    assert "runs; swept: adapter, adapter.beta_init, adapter.alpha_init, adapter.use_beta" in text
    assert "drawing the recorded sparsity instead" in text
    assert "skipped: no merged/ exports" in text
    assert images >= 4  # the sweep, (a), (b), (c) inline
    assert not (tmp_path / "figures").exists()  # nothing written unless SPP_SAVE_FIGURES=1


def _tiny_results(root) -> None:
    """Three tiny Wanda 2:4 runs (pruned, SPP, LoRA*) with perplexity, CSV logs and merged exports."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = ["-m", "model=tiny", "debug=fast", "pruner=wanda", "sparsity=nm2_4", "adapter=none,spp,lora",
            "eval.max_windows=2", f"data_dir={SAMPLE_DATA_DIR}", f"cache_dir={root / 'cache'}",
            f"hydra.sweep.dir={root / 'runs'}",
            "hydra.sweep.subdir=${hydra.job.num}_${adapter.name}"]
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_results_notebook_executes_and_draws_the_four_figures(tmp_path):
    import matplotlib.image as mpimg

    _tiny_results(tmp_path)
    figures = tmp_path / "figures"
    text, _ = execute_notebook({"SPP_RESULTS_DIR": str(tmp_path / "runs"), "SPP_FIGURES_DIR": str(figures),
                                "SPP_SAVE_FIGURES": "1"})
    assert "zero patterns identical: True" in text
    assert "2 curves" in text  # SPP and LoRA
    assert "differing 0" in text
    for name in FIGURES:
        path = figures / name
        assert path.is_file(), name
        assert path.stat().st_size > 10_000, f"{name} is suspiciously small"
        img = mpimg.imread(path)
        assert img.ndim == 3 and min(img.shape[:2]) >= 200
        assert float(img[..., :3].std()) > 0.02, f"{name} is blank"
    summaries = sorted((tmp_path / "runs").glob("*/summary.json"))
    assert [json.loads(p.read_text())["run"]["adapter"] for p in summaries] == ["none", "spp", "lora"]
