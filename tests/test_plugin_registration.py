"""What a plug-in folder's registration may and may not do, run as a user runs the commands (``python prune.py`` /
``python train.py`` in a fresh process, the folder named by ``SPP_PLUGINS``):

- a folder named like a standard-library module (``random``) is imported as a submodule of ``spp.plugins``, registers,
  and its relative imports work: ``prune.py pruner=random`` prunes with it;
- a plug-in registering a name the project holds (a pruner ``wanda``, an adapter method ``spp``) is refused in one
  line naming both files, even when another pruner or method is chosen;
- an adapter plug-in whose config leaves out ``name`` (it would compose as ``adapter.name=none`` and train nothing)
  is refused in one line naming the plug-in and the fix, before anything runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR

RANDOM_INIT = '''
"""A pruner named like the standard library's random: seeded random scores, from a relative import."""

from dataclasses import dataclass

from spp.pruning import MatrixOutcome, Pruner, PrunerConfig, register_pruner
from spp.pruning.patterns import mask_from_scores

from .rule import seeded_scores


@dataclass
class RandomConfig(PrunerConfig):
    name: str = "random"
    seed: int = 0


class RandomPruner(Pruner):
    needs_calibration = False

    def solve(self, leaf, weight, stats, sparsity):
        return MatrixOutcome(mask_from_scores(seeded_scores(weight, self.cfg.seed), sparsity, scope="row"))


register_pruner("random", RandomConfig, RandomPruner)
'''
RANDOM_RULE = '''
import torch


def seeded_scores(weight, seed):
    return torch.rand(weight.shape, generator=torch.Generator().manual_seed(seed))
'''
WANDA_INIT = '''
from dataclasses import dataclass

from spp.pruning import MatrixOutcome, Pruner, PrunerConfig, register_pruner


@dataclass
class OtherWandaConfig(PrunerConfig):
    name: str = "wanda"


class OtherWanda(Pruner):
    needs_calibration = False

    def solve(self, leaf, weight, stats, sparsity):
        return MatrixOutcome(weight != 0)


register_pruner("wanda", OtherWandaConfig, OtherWanda)
'''
ADAPTER_INIT = '''
from dataclasses import dataclass

from torch import nn

from spp.adapters.base import AdapterMethod, freeze_all
from spp.adapters.config import AdapterConfig
from spp.adapters.registry import register


@dataclass
class {cls}Config(AdapterConfig):
    {name_field}
    init: float = 1.0


class {cls}(AdapterMethod):
    name = "{name}"
    config_class = {cls}Config

    def inject(self, model, cfg, masks):
        freeze_all(model)
        return model

    def merge(self, model, cfg, masks):
        return model, {{}}

    def save(self, model, directory, extra):
        pass

    def load(self, model, directory, masks):
        return model, {cls}Config()


register({cls}())
'''


def _folder(root: Path, name: str, files: dict[str, str]) -> Path:
    """A plug-in folder ``<root>/<name>`` holding ``files`` (``{path inside it: text}``)."""
    for rel, text in files.items():
        (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / name / rel).write_text(textwrap.dedent(text).lstrip())
    return root / name


def _run(args: list[str], plugins: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "PYTHONPATH": str(REPO_ROOT), "SPP_PLUGINS": str(plugins)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def _one_line(proc: subprocess.CompletedProcess, script: str) -> str:
    """The single error line of a refused command (exit status 2, no traceback)."""
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert lines[0].startswith(f"{script}: error: "), lines[0]
    return lines[0]


def _adapter(root: Path, name: str, cls: str, name_field: str) -> Path:
    yaml = f"defaults:\n  - {name}_schema\n  - _self_\n"
    init = ADAPTER_INIT.format(cls=cls, name=name, name_field=name_field)
    return _folder(root, name, {"__init__.py": init, f"conf/adapter/{name}.yaml": yaml})


def test_a_plugin_folder_named_like_a_standard_module_registers_and_prunes(tmp_path):
    folder = _folder(tmp_path, "random", {"__init__.py": RANDOM_INIT, "rule.py": RANDOM_RULE,
                                          "conf/pruner/random.yaml": "defaults:\n  - random_schema\n  - _self_\n"})
    out = tmp_path / "out"
    proc = _run(["prune.py", "model=tiny", "pruner=random", "pruner.seed=3", "sparsity=nm2_4", "device=cpu",
                 f"run_dir={out}", f"cache_dir={tmp_path / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}",
                 f"hydra.run.dir={tmp_path / 'hydra'}"], folder)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "/random-nm2_4-" in json.loads((out / "timing.json").read_text())["cache_path"]
    weights = {}
    for path in sorted((out / "model").glob("*.safetensors")):
        weights.update(load_file(path))
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    expected = torch.rand(q.shape, generator=torch.Generator().manual_seed(3))  # the rule, written here again
    keep = torch.zeros_like(q, dtype=torch.bool).reshape(q.shape[0], -1, 4)
    keep.scatter_(-1, expected.reshape(q.shape[0], -1, 4).topk(2, dim=-1).indices, True)
    assert torch.equal(q != 0, keep.reshape(q.shape))


def test_a_plugin_taking_a_pruner_name_is_one_line_naming_both_files(tmp_path):
    folder = _folder(tmp_path, "other_wanda", {"__init__.py": WANDA_INIT})
    proc = _run(["prune.py", "model=tiny", "pruner=magnitude", f"hydra.run.dir={tmp_path / 'hydra'}"], folder)
    line = _one_line(proc, "prune.py")
    assert "pruner 'wanda' is registered twice" in line, line
    assert str(REPO_ROOT / "spp" / "pruning" / "pruners" / "wanda") in line and str(folder / "__init__.py") in line


def test_a_plugin_taking_an_adapter_name_is_one_line_naming_both_files(tmp_path):
    folder = _adapter(tmp_path, "spp", "OtherSPP", 'name: str = "spp"')
    proc = _run(["train.py", "adapter=lora", "--cfg", "job"], folder)
    line = _one_line(proc, "train.py")
    assert "adapter method 'spp' is registered twice" in line, line
    assert str(REPO_ROOT / "spp" / "adapters" / "methods" / "spp") in line and str(folder / "__init__.py") in line


def test_an_adapter_plugin_without_a_name_is_refused_before_anything_runs(tmp_path):
    folder = _adapter(tmp_path, "row_scale", "RowScale", "")
    run = tmp_path / "run"
    proc = _run(["train.py", "experiment=tiny_smoke", "adapter=row_scale", f"run_dir={run}",
                 f"cache_dir={tmp_path / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}",
                 f"hydra.run.dir={tmp_path / 'hydra'}"], folder)
    line = _one_line(proc, "train.py")
    assert "adapter method 'row_scale'" in line and "RowScaleConfig.name defaults to 'none'" in line, line
    assert "set `name: str = 'row_scale'` in RowScaleConfig" in line and str(folder / "__init__.py") in line, line
    assert not run.exists()
