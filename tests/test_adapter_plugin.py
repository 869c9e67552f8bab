"""A new adapter method from a temporary folder and one YAML only, without editing
any file of ``spp/``, runs end to end (prune, fit, merge, audit, export) with ``SPP_PLUGINS``, and
``eval.py adapter_dir=`` of its run gives the numbers of the exported merged model's evaluation.

The plug-in (``my_adapter``) scales every row of a target weight by a trained vector: ``W_eff = s ⊙ W`` with
``s`` (m x 1) starting at ``adapter.init`` (1: the pruned model); merged as ``W <- s ⊙ W`` (a zero stays zero). It
follows ``docs/architecture.md``'s "How to add an adapter method" steps: a config dataclass, an ``AdapterMethod``,
``register`` in the folder's ``__init__``, ``conf/adapter/my_adapter.yaml`` starting ``defaults: [my_adapter_schema,
_self_]``.

The page's own example (``row_scale``: ``W * scale[:, None]``) is copied from ``docs/architecture.md`` into a
temporary folder and trained on the tiny model: every pruned zero survives in the export, its scales train, and
``plan=true`` plans the run's own trainable count (the method's ``inject``, not a model of it by name).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spp.models.tiny import tiny_llama
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DOC = REPO_ROOT / "docs" / "architecture.md"

PLUGIN = '''
"""A per-row scale adapter: W_eff = s ⊙ W (s: out_features x 1), merged in place."""

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from spp.adapters.base import AdapterMethod, MergedLayer, freeze_all, set_submodule, target_linears
from spp.adapters.config import AdapterConfig
from spp.adapters.registry import register


@dataclass
class MyAdapterConfig(AdapterConfig):
    method: ClassVar[str] = "my_adapter"
    name: str = "my_adapter"
    init: float = 1.0


class RowScale(nn.Module):
    def __init__(self, base, init):
        super().__init__()
        self.base = base
        self.row_scale = nn.Parameter(torch.full((base.out_features, 1), float(init), dtype=torch.float32,
                                                 device=base.weight.device))

    def weight_eff(self):
        return self.base.weight * self.row_scale.to(self.base.weight.dtype)

    def forward(self, x):
        return F.linear(x, self.weight_eff(), self.base.bias)


def layers(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, RowScale)}


class MyAdapter(AdapterMethod):
    name = "my_adapter"
    config_class = MyAdapterConfig
    label = "row scale"

    def inject(self, model, cfg, masks):
        found = target_linears(model, list(cfg.targets))
        freeze_all(model)
        for name, linear in found.items():
            set_submodule(model, name, RowScale(linear, cfg.init))
        return model

    def merge(self, model, cfg, masks):
        with torch.no_grad():
            for name, layer in layers(model).items():
                layer.base.weight.copy_(layer.weight_eff())
                set_submodule(model, name, layer.base)
        return model, {}

    def save(self, model, directory, extra):
        tensors = {f"{n}.row_scale": m.row_scale.detach().contiguous() for n, m in layers(model).items()}
        save_file(tensors, str(Path(directory) / "row_scale.safetensors"))

    def load(self, model, directory, masks):
        state = load_file(str(Path(directory) / "row_scale.safetensors"))
        targets = sorted({k.rsplit(".", 2)[-2] for k in state})
        cfg = MyAdapterConfig(targets=targets)
        self.inject(model, cfg, masks)
        with torch.no_grad():
            for name, layer in layers(model).items():
                layer.row_scale.copy_(state[f"{name}.row_scale"])
        return model, cfg

    def external_parameters(self, model):
        return [(m, m.base.weight) for m in layers(model).values()]

    def effective_weight(self, module, full):
        if not isinstance(module, RowScale):
            return None
        return full(module.base.weight) * full(module.row_scale.detach())

    def merged_layer(self, module, mask):
        if not isinstance(module, RowScale):
            return None
        out = {"weight": module.weight_eff().detach()}
        if module.base.bias is not None:
            out["bias"] = module.base.bias.detach()
        return MergedLayer(out)


register(MyAdapter())
'''

YAML = """\
# A per-row scale s ⊙ W (tests/test_adapter_plugin.py).
defaults:
  - my_adapter_schema
  - _self_

name: my_adapter
init: 1.0
"""

COMPOSE = """
import json, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from spp.errors import UserError
from spp.paths import CONF_DIR
from spp.plugins import load_plugins
from spp.training.config import load_job, register_train_schema

load_plugins()
register_train_schema()
out = {}
with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    cfg = compose("train", overrides=["adapter=my_adapter", "adapter.init=0.5"])
    out["type"] = OmegaConf.get_type(cfg.adapter).__name__
    out["init"] = load_job(cfg).adapter.init
    try:
        compose("train", overrides=["adapter=my_adapter", "adapter.inti=0.5"])
    except Exception as err:  # noqa: BLE001 - Hydra's composition error
        out["typo"] = type(err).__name__
    try:
        load_job(compose("train", overrides=["adapter=my_adapter", "+adapter.inti=0.5"]))
    except UserError as err:
        out["plus_typo"] = str(err)
print(json.dumps(out))
"""


def _plugin(tmp: Path) -> Path:
    folder = tmp / "my_adapter"
    (folder / "conf" / "adapter").mkdir(parents=True)
    (folder / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    (folder / "conf" / "adapter" / "my_adapter.yaml").write_text(YAML)
    return folder


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _ppl(results: Path) -> dict:
    return json.loads(results.read_text())["records"][0]["ppl"]["wikitext2"]


def test_a_plugin_adapter_composes_typed_and_refuses_typos(tmp_path):
    env = {**os.environ, "SPP_PLUGINS": str(_plugin(tmp_path)), "PYTHONPATH": str(REPO_ROOT)}
    out = json.loads(_run(["-c", COMPOSE], env).stdout.strip().splitlines()[-1])
    assert out["type"] == "MyAdapterConfig" and out["init"] == 0.5
    assert out["typo"] == "ConfigCompositionException"
    assert "unknown config key adapter.inti" in out["plus_typo"] and "adapter.init" in out["plus_typo"]


@pytest.mark.slow
def test_a_plugin_adapter_trains_merges_exports_and_evaluates(tmp_path):
    """train.py experiment=tiny_smoke adapter=my_adapter end to end; eval.py adapter_dir= equals the export's eval."""
    env = {**os.environ, "SPP_PLUGINS": str(_plugin(tmp_path)), "PYTHONPATH": str(REPO_ROOT)}
    run, cache = tmp_path / "run", tmp_path / "cache"
    _run(["train.py", "experiment=tiny_smoke", "adapter=my_adapter", f"run_dir={run}", f"cache_dir={cache}",
          f"data_dir={SAMPLE_DATA_DIR}"], env)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["run"]["adapter"] == "my_adapter"
    audits = summary["sparsity"]["audits"]
    assert [a["when"] for a in audits][0] == "fit_start" and audits[-1]["when"] == "merged"
    assert all(a["layers"] == 14 and a["sparsity"] == 0.5 for a in audits)
    assert summary["params"]["trainable"] == 2 * (64 + 32 + 32 + 64 + 128 + 128 + 64)  # s: out_features per layer
    assert json.loads((run / "adapter" / "adapter_method.json").read_text())["method"] == "my_adapter"
    assert (run / "adapter" / "row_scale.safetensors").is_file() and (run / "merged" / "spp_export.json").is_file()
    common = ["eval.seqlen=128", "eval.max_windows=2", "eval.tasks=[]", f"data_dir={SAMPLE_DATA_DIR}"]
    _run(["eval.py", "model=tiny", "pruner=wanda", "sparsity=nm2_4", "calibration.nsamples=4",
          "calibration.seqlen=128", f"cache_dir={cache}", f"adapter_dir={run / 'adapter'}",
          f"run_dir={tmp_path / 'eval_adapter'}", *common], env)
    _run(["eval.py", f"model.path={run / 'merged'}", f"run_dir={tmp_path / 'eval_merged'}", *common], env)
    adapted, merged = _ppl(tmp_path / "eval_adapter" / "results.json"), _ppl(tmp_path / "eval_merged" / "results.json")
    assert adapted["window_nll"] == merged["window_nll"] and adapted["ppl"] == merged["ppl"]
    assert merged["ppl"] == pytest.approx(summary["perplexity"]["merged"]["ppl"], rel=1e-12)


def doc_files() -> dict[str, str]:
    """The adapter plug-in's files as ``docs/architecture.md`` shows them: ``{path inside the folder: text}``."""
    out = {}
    for part in DOC.read_text().split("<!-- plugin-adapter: ")[1:]:
        path, rest = part.split(" -->\n", 1)
        out[path] = rest.split("```", 2)[1].split("\n", 1)[1]
    return out


def _plan(args: list[str], env: dict[str, str], hydra_dir: Path) -> dict:
    """``train.py <args> plan=true plan_json=-``'s plan (Hydra's log folder under ``hydra_dir``)."""
    out = _run(["train.py", *args, "plan=true", "plan_json=-", f"hydra.run.dir={hydra_dir}"], env).stdout
    return json.loads(out[out.index("{"):])


def test_the_documented_adapter_trains_keeps_zeros_and_is_planned_as_it_trains(tmp_path):
    files = doc_files()
    assert set(files) == {"row_scale/__init__.py", "row_scale/conf/adapter/row_scale.yaml"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = {**os.environ, "SPP_PLUGINS": str(tmp_path / "row_scale"), "PYTHONPATH": str(REPO_ROOT)}
    run = tmp_path / "run"
    args = ["experiment=tiny_smoke", "adapter=row_scale", "sparsity=nm2_4", "trainer.progress_bar=none"]
    _run(["train.py", *args, f"run_dir={run}", f"cache_dir={tmp_path / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}",
          f"hydra.run.dir={tmp_path / 'hydra'}"], env)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["losses"]["optimizer_steps"] == 6
    rows = sum(m.out_features for n, m in tiny_llama(seed=0).named_modules()
               if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in TARGETS)
    assert summary["params"]["trainable"] == rows > 0  # one scale per output row of every target projection
    scales = load_file(str(run / "adapter" / "row_scale.safetensors"))
    assert len(scales) == 14 and any(not torch.equal(t, torch.ones_like(t)) for t in scales.values())  # trained
    merged = {}
    for path in sorted((run / "merged").glob("*.safetensors")):
        merged.update(load_file(path))
    projections = [n for n in merged if n.endswith(".weight") and n.split(".")[-2] in TARGETS]
    assert len(projections) == 14
    for name in projections:  # 2:4: every group of 4 weights of a row keeps at least its 2 pruned zeros
        groups = merged[name].reshape(merged[name].shape[0], -1, 4)
        assert bool(((groups == 0).sum(-1) >= 2).all()), name
    plan = _plan(args, env, tmp_path / 'plan')
    assert plan["adapter"] == "row_scale" and plan["trainable_params"] == summary["params"]["trainable"]

