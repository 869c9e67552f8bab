"""``spp.loggers``: run names and tags from plain names, loggers built by ``hydra.utils.instantiate`` from the typed
``logger`` group (W&B offline without a key, all under the run directory), end metrics reach every logger."""

from __future__ import annotations

import csv

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from spp.eval.job_config import EvalJobConfig, register_eval_schema
from spp.eval.tables import final_metrics
from spp.loggers import (
    CSVLoggerConfig,
    LoggersConfig,
    WandbLoggerConfig,
    build_loggers,
    log_final_metrics,
    run_tags,
    save_and_print_config,
    wandb_mode,
)
from spp.paths import CONF_DIR


@pytest.fixture()
def no_wandb_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc


def test_run_tags_from_plain_names_and_wandb_overrides():
    ids = run_tags("tiny", "sparsegpt", "unstructured50", "spp", 8)
    assert ids == {"name": "tiny-sparsegpt-unstructured50-spp-r8", "group": "tiny-sparsegpt-unstructured50",
                   "tags": ["tiny", "sparsegpt", "unstructured50", "spp", "r8"]}
    none = run_tags("tiny", "wanda", "nm2_4", "none", 16)
    assert none["name"] == "tiny-wanda-nm2_4-none" and none["tags"][-1] == "r16"
    assert run_tags("tiny", "none", "dense", "none")["tags"] == ["tiny", "none", "dense", "none"]  # no rank: no r tag
    distill = run_tags("tiny", "wanda", "nm2_4", "spp", 8, objective="distill")  # not the paper's loss: named
    assert distill["name"] == "tiny-wanda-nm2_4-spp-r8-distill" and distill["tags"][-1] == "distill"
    wb = WandbLoggerConfig(name="mine", group="table4", tags=["table4", "tiny"])
    over = run_tags("tiny", "wanda", "nm2_4", "lora", 8, wb)
    assert (over["name"], over["group"]) == ("mine", "table4")
    assert over["tags"] == ["tiny", "wanda", "nm2_4", "lora", "r8", "table4"]  # extended, no duplicates


@pytest.mark.usefixtures("no_wandb_key")
def test_loggers_from_the_composed_group_write_under_the_run_dir(tmp_path):
    register_eval_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=["model=tiny", "logger=[wandb,tensorboard]"])
    job: EvalJobConfig = OmegaConf.to_object(cfg)
    assert job.logger.csv is None and job.logger.wandb.mode == "auto"
    ids = run_tags("tiny", "wanda", "nm2_4", "spp", 4, job.logger.wandb)
    loggers = build_loggers(job.logger, tmp_path / "run", ids)
    assert [type(lg).__name__ for lg in loggers] == ["CSVLogger", "TensorBoardLogger", "WandbLogger"]
    init = loggers[-1]._wandb_init
    assert init["mode"] == "offline" and init["dir"] == str(tmp_path / "run") and init["project"] == "spp"
    assert (init["name"], init["group"], init["tags"]) == (ids["name"], ids["group"], ids["tags"])
    assert isinstance(init["tags"], list)
    assert loggers[0].log_dir.rstrip("/") == str(tmp_path / "run" / "csv")
    assert loggers[1].log_dir.rstrip("/") == str(tmp_path / "run" / "tensorboard")


def test_wandb_mode_and_its_check(no_wandb_key, monkeypatch):
    assert wandb_mode("auto") == "offline" and wandb_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("auto") == "disabled"
    with pytest.raises(ValueError, match="logger.wandb.mode='onlin'"):
        WandbLoggerConfig(mode="onlin")


def test_final_metrics_reach_the_csv_logger(tmp_path):
    summary = {
        "perplexity": {"dense": {"ppl": 30.0}, "pruned": {"ppl": 200.0}, "merged": None},
        "zero_shot": {"metrics": {"spp_rte": {"acc": 0.5, "acc_norm": 0.6}}},
        "sparsity": {"before": 0.5, "after": 0.5}, "params": {"trainable": 10}, "merge": {"removed_fraction": 0.25},
    }
    metrics = final_metrics(summary)
    assert metrics == {"final/ppl_dense": 30.0, "final/ppl_pruned": 200.0, "final/acc/spp_rte": 0.5,
                       "final/acc_norm/spp_rte": 0.6, "final/sparsity_before": 0.5, "final/sparsity_after": 0.5,
                       "final/trainable_params": 10.0, "final/remask_removed_fraction": 0.25}
    (logger,) = build_loggers(LoggersConfig(csv=CSVLoggerConfig(name="m")), tmp_path, run_tags("a", "b", "c", "none"))
    log_final_metrics([logger], metrics, step=7)
    (row,) = list(csv.DictReader((tmp_path / "m" / "metrics.csv").open()))
    assert int(row["step"]) == 7 and float(row["final/ppl_pruned"]) == 200.0
    assert float(row["final/remask_removed_fraction"]) == 0.25


def test_resolved_config_is_saved(tmp_path, capsys):
    cfg = OmegaConf.create({"model": {"name": "tiny", "path": "${model.name}"}, "seed": 3})
    path = save_and_print_config(cfg, tmp_path, show=True)
    assert OmegaConf.load(path) == OmegaConf.create({"model": {"name": "tiny", "path": "tiny"}, "seed": 3})
    assert "model" in capsys.readouterr().out
