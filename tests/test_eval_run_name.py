"""One evaluation is filed under one name: the output folder Hydra composes (``spp_eval_name``) and the W&B run
(``spp.eval.runner.job_loggers``) read the same origin (:func:`spp.eval.run_name.run_origin`), the same fallback
included when the evaluated folder's ``spp_export.json`` records no run.

Composed through ``conf/evaluate.yaml`` by Hydra, the W&B run started offline for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from spp.commands.entry import register_run_dir_resolver
from spp.eval import runner
from spp.eval.job_config import register_eval_schema
from spp.eval.run_name import register_eval_resolvers
from spp.export.manifest import ExportManifest
from spp.loggers import finish_wandb, wandb_loggers
from spp.paths import CONF_DIR
from tests.test_wandb_offline import wandb_offline  # noqa: F401  (W&B offline, its folders in a temporary dir)

RECORDED = {"pruning": {"model": "tiny", "pruner": "wanda", "sparsity": "nm2_4", "cache_key": "abc"},
            "adapter": {"name": "spp", "r": 16}}


def _names(model_path: Path, out: Path, *overrides: str) -> tuple[str, str]:
    """(the output folder under ``outputs/eval/`` without its time, the W&B run name) of one eval.py job."""
    register_run_dir_resolver()
    register_eval_resolvers()
    register_eval_schema()
    args = ["model=tiny", f"model.path={model_path}", "logger=[csv,wandb]", *overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        folder = str(compose("evaluate", overrides=args, return_hydra_config=True).hydra.run.dir)
        job = OmegaConf.to_object(compose("evaluate", overrides=args))
    (wandb,) = wandb_loggers(runner.job_loggers(job, out))  # the W&B run eval.py logs its results to
    name = wandb.experiment.name
    finish_wandb()
    return str(Path(folder.removeprefix("outputs/eval/")).parent), name


@pytest.mark.parametrize("record, overrides, folder, wandb", [
    # no spp_export.json, an adapter_dir: its adapter_method.json's method and rank for both names
    (None, ["pruner=magnitude", "sparsity=nm2_4", "adapter_dir=ADAPTER"], "tiny/magnitude-nm2_4/spp-r8",
     "tiny-magnitude-nm2_4-spp-r8"),
    # a folder whose spp_export.json records no run: the command line's pruner and sparsity, adapter "export"
    ({}, ["pruner=magnitude", "sparsity=nm2_4"], "tiny/magnitude-nm2_4/export", "tiny-magnitude-nm2_4-export"),
    ({}, [], "tiny/none-dense/export", "tiny-none-dense-export"),
    # an export of an adapter=none run names it
    ({**RECORDED, "adapter": {"name": "none"}}, [], "tiny/wanda-nm2_4/none", "tiny-wanda-nm2_4-none"),
    # the recorded run wins over the command line for both names
    (RECORDED, ["pruner=magnitude", "sparsity=nm2_4"], "tiny/wanda-nm2_4/spp-r16", "tiny-wanda-nm2_4-spp-r16"),
    # no spp_export.json: the command line's names
    (None, ["pruner=magnitude", "sparsity=nm2_4"], "tiny/magnitude-nm2_4", "tiny-magnitude-nm2_4-none"),
])
def test_output_folder_and_wandb_run_name_the_same_origin(wandb_offline, tmp_path, record, overrides, folder,  # noqa: F811
                                                          wandb):
    model = tmp_path / "merged"
    model.mkdir()
    if record is not None:
        ExportManifest(adapter=record.get("adapter", {}), dtype="torch.float32",
                       pruning=record.get("pruning", {})).write(model)
        assert json.loads((model / "spp_export.json").read_text())["pruning"] == record.get("pruning", {})
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_method.json").write_text(json.dumps({"method": "spp", "config": {"r": 8}}))
    overrides = [arg.replace("ADAPTER", str(adapter)) for arg in overrides]
    assert _names(model, tmp_path / "eval", *overrides) == (folder, wandb)


def test_the_printed_label_names_the_exports_recorded_model(tmp_path):
    """The label of the log lines and ``eval_report.md`` reads the same origin: an export of a ``tiny_gemma2`` run
    evaluated with the default ``model=`` is not labelled with the default model's name."""
    register_eval_schema()
    model = tmp_path / "merged"
    model.mkdir()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        job = OmegaConf.to_object(compose("evaluate", overrides=[f"model.path={model}"]))
    assert runner.default_label(job) == f"{job.model.name}:merged"  # control: no spp_export.json, the command line
    ExportManifest(adapter={"name": "spp", "r": 8}, dtype="torch.float32",
                   pruning={**RECORDED["pruning"], "model": "tiny_gemma2"}).write(model)
    assert runner.default_label(job) == "tiny_gemma2:merged wanda nm2_4"
