"""``notebooks/results.ipynb`` executes on a small results directory made by tiny ``train.py`` runs and saves
four non-trivial PNG figures; its sparsity check finds identical zero patterns before and after the merge."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR

FIGURES = ("ppl_zeroshot_bars.png", "loss_curves.png", "layer_sparsity.png", "nm_block_before_after.png")


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
def test_results_notebook_executes_and_draws_the_four_figures(tmp_path, monkeypatch):
    import matplotlib.image as mpimg
    import nbformat
    from nbclient import NotebookClient

    _tiny_results(tmp_path)
    figures = tmp_path / "figures"
    monkeypatch.setenv("SPP_RESULTS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPP_FIGURES_DIR", str(figures))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(REPO_ROOT / "notebooks" / "results.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO_ROOT / "notebooks")}}).execute()
    text = "\n".join(
        out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
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
