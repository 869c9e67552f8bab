"""A pruner added from a temporary folder and one YAML only, as ``docs/pruning.md`` ("Adding a pruner") says, with
no file of ``spp/`` edited: the two files are copied from that page into a temporary ``my_pruner/`` folder named
by ``SPP_PLUGINS``, and the commands run as a user runs them (``python train.py ...`` in a fresh process).

- ``train.py experiment=tiny_smoke pruner=my_pruner sparsity=nm2_4``: prune, fit, merge, audit, export; the
  exported merged weights' zeros are the dummy rule's, computed here independently from the dense tiny model;
- the cache entry it wrote is re-used by a second run (``train.py adapter=none``, ``prune.py``), and the plug-in's
  own setting is in the key (``pruner.keep_first=2`` misses, and its saved model follows the rule with 2);
- ``--help`` and ``--cfg job`` show the plug-in's key; a misspelled key and a key of another pruner are refused in
  one line before anything runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from spp.models.tiny import tiny_llama
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR

DOC = REPO_ROOT / "docs" / "pruning.md"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def doc_files() -> dict[str, str]:
    """The plug-in's files as ``docs/pruning.md`` shows them: ``{path inside the temporary folder: text}``."""
    out = {}
    for part in DOC.read_text().split("<!-- plugin-pruner: ")[1:]:
        path, rest = part.split(" -->\n", 1)
        out[path] = rest.split("```", 2)[1].split("\n", 1)[1]
    return out


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The temporary folder holding ``my_pruner/`` and the environment naming it in ``SPP_PLUGINS``."""
    tmp = tmp_path_factory.mktemp("plugin")
    files = doc_files()
    assert set(files) == {"my_pruner/__init__.py", "my_pruner/conf/pruner/my_pruner.yaml"}
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "PYTHONPATH": str(REPO_ROOT), "SPP_PLUGINS": str(tmp / "my_pruner")}
    env.pop("HYDRA_FULL_ERROR", None)
    return tmp, env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python <args>`` in the repository, as a user runs it; fails the test on a non-zero exit."""
    proc = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def train(tmp: Path, env: dict[str, str], name: str, *extra: str) -> dict[str, Any]:
    """``train.py experiment=tiny_smoke pruner=my_pruner sparsity=nm2_4`` in ``<tmp>/<name>``; its summary."""
    run(["train.py", "experiment=tiny_smoke", "pruner=my_pruner", "sparsity=nm2_4", "trainer.progress_bar=none",
         f"run_dir={tmp / name}", f"cache_dir={tmp / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}",
         f"hydra.run.dir={tmp / 'hydra' / name}", *extra], env)
    return json.loads((tmp / name / "summary.json").read_text())


def prune(tmp: Path, env: dict[str, str], name: str, *extra: str) -> dict[str, Any]:
    """``prune.py model=tiny pruner=my_pruner sparsity=nm2_4`` into ``<tmp>/<name>``; its ``timing.json``."""
    run(["prune.py", "model=tiny", "pruner=my_pruner", "sparsity=nm2_4", "device=cpu", f"run_dir={tmp / name}",
         f"cache_dir={tmp / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}", f"hydra.run.dir={tmp / 'hydra' / name}",
         *extra], env)
    return json.loads((tmp / name / "timing.json").read_text())


def entries(tmp: Path) -> list[Path]:
    """The pruning cache entries the runs wrote."""
    return sorted(p for p in (tmp / "cache" / "pruning").glob("*/my_pruner-nm2_4-*") if p.is_dir())


def expected_masks(keep_first: int) -> dict[str, torch.Tensor]:
    """The dummy rule, written here from its definition: in every group of 4 columns of a row of the dense tiny
    model's projections, keep the 2 largest |W|, the first ``keep_first`` columns of the row always."""
    out = {}
    for name, weight in tiny_llama(seed=0).state_dict().items():
        if name.endswith(".weight") and name.split(".")[-2] in TARGETS:
            scores = weight.abs().clone()
            scores[:, :keep_first] = float("inf")
            groups = scores.reshape(scores.shape[0], -1, 4)
            keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, groups.topk(2, dim=-1).indices, True)
            out[name] = keep.reshape(weight.shape)
    return out


def saved_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files of a saved model folder."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def assert_zeros_follow(weights: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]) -> None:
    """The zeros of every pruned projection are exactly the rule's pruned weights."""
    assert set(masks) <= set(weights)
    for name, keep in masks.items():
        assert torch.equal(weights[name] != 0, keep), name


@pytest.fixture(scope="module")
def trained(plugin) -> dict[str, Any]:
    """The end-to-end training run with the plug-in pruner (its summary)."""
    tmp, env = plugin
    return train(tmp, env, "run1")


def test_train_prunes_with_the_plugin_fits_merges_audits_and_exports(plugin, trained) -> None:
    tmp, _ = plugin
    assert trained["config"]["pruner"] == {"name": "my_pruner", "targets": list(TARGETS), "true_sequential": False,
                                           "keep_first": 1}
    assert trained["pruning"]["cache_hit"] is False and len(entries(tmp)) == 1
    assert trained["losses"]["optimizer_steps"] == 6
    assert trained["sparsity"]["before"] == 0.5 and trained["sparsity"]["after"] == 0.5
    assert [a["when"] for a in trained["sparsity"]["audits"]][-1] == "merged"
    assert trained["perplexity"]["merged"]["ppl"] > 0
    merged = Path(trained["outputs"]["merged_dir"])
    assert_zeros_follow(saved_weights(merged), expected_masks(keep_first=1))
    manifest = json.loads((merged / "spp_export.json").read_text())
    assert manifest["pruning"]["pruner"] == "my_pruner", manifest["pruning"]


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_the_entry_is_reused_and_the_plugins_own_setting_is_in_the_key(plugin, trained) -> None:
    tmp, env = plugin
    again = train(tmp, env, "run2", "adapter=none")  # the same pruning in a second job: read from the entry
    assert again["pruning"]["cache_hit"] is True and len(entries(tmp)) == 1
    timing = prune(tmp, env, "prune_same")
    assert timing["cache_hit"] is True and len(entries(tmp)) == 1
    assert_zeros_follow(saved_weights(tmp / "prune_same" / "model"), expected_masks(keep_first=1))
    timing = prune(tmp, env, "prune_keep2", "pruner.keep_first=2")
    assert timing["cache_hit"] is False and len(entries(tmp)) == 2
    assert_zeros_follow(saved_weights(tmp / "prune_keep2" / "model"), expected_masks(keep_first=2))


RUNNER = """
import contextlib, io, json, runpy, sys
from hydra.core.global_hydra import GlobalHydra

out = {}
for name, argv in json.loads(sys.argv[1]):
    sys.argv, code, stdout, stderr = list(argv), 0, io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code or 0
    GlobalHydra.instance().clear()
    out[name] = [code, stdout.getvalue(), stderr.getvalue()]
print(json.dumps(out))
"""
"""Runs each ``(name, [script, *args])`` of ``argv[1]`` in this one process (torch imported once); prints
``{name: [exit status, stdout, stderr]}``."""


@pytest.mark.slow  # three CLI processes (22 s loaded); CI runs it
def test_help_and_cfg_show_the_plugins_key_and_a_bad_key_is_one_line(plugin) -> None:
    tmp, env = plugin
    cases = {
        "help": ["train.py", "pruner=my_pruner", "--help"],
        "cfg": ["train.py", "experiment=tiny_smoke", "pruner=my_pruner", "pruner.keep_first=3", "--cfg", "job"],
        "prune_cfg": ["prune.py", "model=tiny", "pruner=my_pruner", "--cfg", "job"],
        "typo": ["train.py", "pruner=my_pruner", "pruner.keep_frist=2", f"hydra.run.dir={tmp / 'h1'}"],
        "other": ["prune.py", "pruner=wanda", "pruner.keep_first=2", f"hydra.run.dir={tmp / 'h2'}"],
    }
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(list(cases.items()))], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    code, text, _ = out["help"]
    assert code == 0 and "*my_pruner" in text and "pruner.keep_first" in text, text
    assert "How many leading input columns of every row are always kept." in " ".join(text.split())
    code, text, _ = out["cfg"]
    assert code == 0 and "name: my_pruner" in text and "keep_first: 3" in text, text
    assert out["prune_cfg"][0] == 0 and "keep_first: 1" in out["prune_cfg"][1]
    for case, cmd, words in (("typo", "train.py", ["unknown config key pruner.keep_frist",
                                                   "did you mean pruner.keep_first=?"]),
                             ("other", "prune.py", ["pruner=wanda has no key pruner.keep_first",
                                                    "pruner=my_pruner"])):
        code, _, err = out[case]
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"{cmd}: error: "), (case, err)
        assert all(w in lines[0] for w in words), (case, lines[0])


def test_the_plugin_is_not_part_of_spp() -> None:
    """The dummy pruner lives only in the test's folder: no file of ``spp/`` holds its code."""
    for path in (REPO_ROOT / "spp").rglob("*.py"):
        assert "MyPruner" not in path.read_text() and "keep_first" not in path.read_text(), path
    assert not list((REPO_ROOT / "conf").rglob("my_pruner*"))


@pytest.mark.slow  # one sweep job through submitit's local executor (17 s)
def test_a_submitit_job_prunes_with_the_plugin(plugin) -> None:
    """``hydra/launcher=local`` (as ``slurm``) unpickles the job, the plug-in's classes with it, in a fresh process
    that never ran ``load_plugins``; the job finds the plug-in from ``SPP_PLUGINS`` and prunes with it."""
    tmp, env = plugin
    run(["train.py", "-m", "hydra/launcher=local", "experiment=tiny_smoke", "pruner=my_pruner", "sparsity=nm2_4",
         "adapter=none", "eval=none", "dense_ppl=false", "pruned_ppl=false", f"cache_dir={tmp / 'cache'}",
         f"data_dir={SAMPLE_DATA_DIR}", f"hydra.sweep.dir={tmp / 'submitit'}"], env)
    summaries = list((tmp / "submitit").glob("0_*/summary.json"))
    assert len(summaries) == 1, list((tmp / "submitit").rglob("*"))
    assert json.loads(summaries[0].read_text())["run"]["pruner"] == "my_pruner"
