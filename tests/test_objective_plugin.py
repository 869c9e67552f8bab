"""A training objective added as a user would: one folder (its ``__init__`` registers it) and one YAML, named by
``SPP_PLUGINS``, no file of ``spp/`` edited (``docs/architecture.md``, "How to add a training objective"): it
composes with its own key on the command line and trains ``experiment=tiny_smoke`` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from spp.paths import REPO_ROOT

PLUGIN = '''
"""A dummy objective: the labels' cross-entropy times ``scale``."""
from dataclasses import dataclass

from spp.training.objectives import Objective, ObjectiveConfig, ObjectiveLoss, register_objective


@dataclass
class ScaledCEConfig(ObjectiveConfig):
    name: str = "scaled_ce"
    scale: float = 0.5


@register_objective
class ScaledCE(Objective):
    name = "scaled_ce"
    config_class = ScaledCEConfig

    def loss(self, student, batch, teacher=None):
        ce = student(**batch, use_cache=False).loss
        return ObjectiveLoss(self.cfg.scale * ce, {"ce": ce.detach()})
'''


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_an_objective_from_a_plugin_folder_trains_tiny_smoke(tmp_path):
    folder = tmp_path / "scaled_ce"
    (folder / "conf" / "objective").mkdir(parents=True)
    (folder / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    (folder / "conf" / "objective" / "scaled_ce.yaml").write_text("defaults:\n  - scaled_ce_schema\n  - _self_\n")
    run = tmp_path / "run"
    env = {**os.environ, "SPP_PLUGINS": str(folder), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "train.py", "experiment=tiny_smoke", "objective=scaled_ce",
                           "objective.scale=0.25", "trainer.progress_bar=none", f"run_dir={run}",
                           f"cache_dir={tmp_path / 'cache'}"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["run"]["objective"] == "scaled_ce" and summary["config"]["objective"]["scale"] == 0.25
    losses = summary["losses"]
    assert losses["train"] == pytest.approx([0.25 * ce for ce in losses["train_parts"]["ce"]], rel=1e-6)
    assert summary["sparsity"]["audits"][-1]["kept_zeros_changed"] == 0
    bad = subprocess.run([sys.executable, "train.py", "experiment=tiny_smoke", "objective=scaled_ce",
                          "objective.scael=0.25", f"run_dir={tmp_path / 'bad'}"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "objective.scale" in bad.stderr, bad.stderr[-2000:]
