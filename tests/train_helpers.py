"""Compose ``conf/train.yaml`` for tests: tiny model, fast debug preset, outputs under a temporary directory."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from spp.paths import CONF_DIR, SAMPLE_DATA_DIR
from spp.training.config import TrainJobConfig, load_job, register_train_schema

TINY_RUN = ["model=tiny", "debug=fast", "pruner=wanda", "sparsity=nm2_4", "logger=csv"]


def compose_train(overrides: list[str] | None = None) -> DictConfig:
    """Compose the ``train`` config with ``overrides`` (no Hydra run: ``run_dir`` must be given for jobs)."""
    register_train_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides or []))


def tiny_job(tmp: Path, *extra: str, run: str = "run") -> TrainJobConfig:
    """A tiny end-to-end job writing to ``tmp/<run>`` with its pruning cache in ``tmp/cache`` (typed)."""
    return load_job(compose_train(
        [*TINY_RUN, f"run_dir={tmp / run}", f"cache_dir={tmp / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}", *extra]
    ))
