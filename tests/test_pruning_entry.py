"""Hydra configs of the pruning groups and the ``prune.py`` entry point (run on a tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from spp.paths import CONF_DIR, REPO_ROOT, SAMPLE_DATA_DIR
from spp.pruning import check_nm
from spp.pruning.config import PruneJobConfig, register_prune_schema
from spp.pruning.job import prune_job

GROUPS = {g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml")) for g in ("pruner", "sparsity", "calibration")}


def _compose(overrides: list[str]) -> PruneJobConfig:
    register_prune_schema()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("prune", overrides=overrides)
    return OmegaConf.to_object(cfg)


def test_every_group_option_composes_into_the_typed_job() -> None:
    assert {"magnitude", "wanda", "sparsegpt", "dsnot", "none"} <= set(GROUPS["pruner"])
    assert {"dense", "unstructured50", "unstructured75", "unstructured", "nm2_4", "nm4_8", "nm2_8", "nm"} <= set(
        GROUPS["sparsity"]
    )
    for group, options in GROUPS.items():
        for option in options:
            job = _compose([f"{group}={option}"])
            assert isinstance(job, PruneJobConfig)
            getattr(job, group).validate()
            text = (CONF_DIR / group / f"{option}.yaml").read_text()
            header = [line for line in text.splitlines() if line.startswith("#")]
            assert text.startswith("#") and any("python " in line for line in header), option


def test_pattern_names_and_ratios_follow_the_kept_n_of_m_convention() -> None:
    assert _compose(["sparsity=nm2_8"]).sparsity.target_ratio == 0.75
    assert _compose(["sparsity=nm4_8"]).sparsity.target_ratio == 0.5
    custom = _compose(["sparsity=nm", "sparsity.n=1", "sparsity.m=4"]).sparsity
    assert (custom.name, custom.target_ratio) == ("nm1_4", 0.75)
    by_value = _compose(["sparsity=unstructured", "sparsity.ratio=0.6"]).sparsity
    assert (by_value.name, by_value.target_ratio) == ("unstructured0.6", 0.6)
    default = _compose([])
    assert (default.pruner.name, default.sparsity.name, default.calibration.source) == ("wanda", "nm2_4", "c4")
    assert default.calibration.seqlen == 2048 and default.calibration.nsamples == 128
    assert _compose(["pruner=dsnot"]).pruner.refine_targets == ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.mark.parametrize("override", ["pruner.blocksze=64", "calibration.nsample=3", "sparsity.ratio=half"])
def test_misspelled_key_or_wrong_type_fails_at_compose_time(override: str) -> None:
    key = override.split("=")[0].split(".")[-1]
    with pytest.raises((ConfigCompositionException, Exception), match=key if key != "ratio" else "half"):
        _compose([override])


def test_prune_entry_point_saves_a_pruned_model_summary_and_timing(tmp_path: Path) -> None:
    job = _compose([
        "model=tiny", "pruner=wanda", "sparsity=nm2_4", "calibration=quick", "calibration.nsamples=2",
        "calibration.seqlen=64", f"cache_dir={tmp_path / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}", "device=cpu",
    ])
    out = tmp_path / "run"
    timing = prune_job(job, out)
    summary = json.loads((out / "mask_summary.json").read_text())
    assert summary["overall"]["sparsity"] == pytest.approx(0.5) and summary["overall"]["nm_valid"] is True
    assert len(summary["layers"]) == 14 and summary["pruner"] == "wanda"
    assert json.loads((out / "timing.json").read_text())["prune"]["total"] == pytest.approx(timing["prune"]["total"])
    assert "**overall**" in (out / "report.md").read_text()
    saved = AutoModelForCausalLM.from_pretrained(out / "model")
    q = saved.model.layers[1].self_attn.q_proj.weight
    assert check_nm(q, 2, 4).exact_groups == q.numel() // 4
    assert (out / "model" / "tokenizer.json").is_file()
    again = prune_job(job, tmp_path / "run2")
    assert again["cache_hit"] is True
    resaved = AutoModelForCausalLM.from_pretrained(tmp_path / "run2" / "model")
    pairs = zip(saved.state_dict().values(), resaved.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


DRIVER = """
import contextlib, runpy, sys, time
from pathlib import Path

import spp.pruning.cache as cache

marks, me, jobs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
prune, lock = cache.prune_offloaded, cache.entry_lock


def wait_for(pattern):
    deadline = time.time() + 40
    while len(list(marks.glob(pattern))) < jobs and time.time() < deadline:
        time.sleep(0.02)


@contextlib.contextmanager
def marked_lock(entry, *args):
    (marks / f"at-lock-{me}").touch()  # this job is about to take the entry's lock
    with lock(entry, *args):
        yield


def counted_prune(*args, **kwargs):
    with open(marks / "prunes.log", "a") as fh:
        fh.write(me + "\\n")
    wait_for("at-lock-*")  # every job has reached the lock while this one holds it and prunes
    time.sleep(0.5)
    return prune(*args, **kwargs)


cache.prune_offloaded, cache.entry_lock = counted_prune, marked_lock
(marks / f"ready-{me}").touch()
wait_for("ready-*")  # start the jobs together, after the slow imports
sys.argv = ["prune.py", *sys.argv[4:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow  # two prune.py processes (23 s loaded); CI runs it
def test_two_prune_jobs_with_the_same_key_prune_once(tmp_path: Path) -> None:
    """Two ``prune.py`` processes started together: one prunes under the entry's lock, the other waits for it
    (logging that it does) and then loads the entry from the cache."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "driver.py").write_text(DRIVER)
    common = ["model=tiny", "pruner=wanda", "sparsity=nm2_4", "calibration=quick", "calibration.nsamples=2",
              "calibration.seqlen=64", f"cache_dir={tmp_path / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}",
              "device=cpu", "save_model=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    procs = {
        me: subprocess.Popen(
            [sys.executable, str(tmp_path / "driver.py"), str(marks), me, "2", *common,
             f"hydra.run.dir={tmp_path / me}"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for me in ("a", "b")
    }
    outputs = {me: proc.communicate(timeout=120)[0] for me, proc in procs.items()}
    elapsed = time.perf_counter() - start
    assert all(proc.returncode == 0 for proc in procs.values()), outputs
    pruned = (marks / "prunes.log").read_text().split()
    assert len(pruned) == 1, f"both jobs pruned: {outputs}"
    (waiter,) = {"a", "b"} - set(pruned)
    hits = {me: json.loads((tmp_path / me / "timing.json").read_text())["cache_hit"] for me in ("a", "b")}
    assert hits == {pruned[0]: False, waiter: True}
    assert "waiting for it" in outputs[waiter] and "waiting for it" not in outputs[pruned[0]]
    assert elapsed < 60
