"""Dry run of a ``train.py -m`` sweep: expand it into jobs and compose (never run) each job's typed config.

Use: ``python -m lab.plan model=llama7b pruner=wanda,sparsegpt sparsity=unstructured50,nm2_4
adapter=none,spp`` (or ``python experiments/plan.py ...``; ``--cfg`` prints every job's full resolved config, as
``python train.py <job> --cfg job`` would). The sweep is expanded exactly as Hydra's basic sweeper expands it,
then each job is composed and converted into the typed job (:class:`spp.training.config.TrainJobConfig`) with
``OmegaConf.to_object``: a misspelled key or a wrong type fails at compose time and an out-of-range value in the
dataclasses' ``__post_init__``, before any weight is loaded. The experiments' ``run.sh`` scripts call this when
``DRY=1``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from spp.paths import CONF_DIR
from spp.training.config import register_train_schema

PLAN_KEYS = ("model.name", "pruner.name", "sparsity.name", "adapter.name", "adapter.r", "adapter.use_beta",
             "adapter.alpha_init", "adapter.beta_init", "adapter.residual", "trainer.lr", "trainer.max_epochs",
             "trainer.max_steps", "data.train_batch_size", "data.max_examples", "eval.tasks", "seed")
"""The settings printed per job (the rest is in ``--cfg``)."""


def expand_sweep(overrides: Sequence[str]) -> list[list[str]]:
    """The job override lists Hydra's basic sweeper makes from ``overrides`` (``a=1,2 b=x`` → 2 jobs)."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def compose_job(overrides: Sequence[str]) -> DictConfig:
    """Compose ``conf/train.yaml`` with one job's overrides and convert it once into the typed job, which is the
    validation (as ``train.py`` does it); returns the resolved config.

    ``hydra.*`` overrides (sweep directory, launcher) are not part of the job config and are skipped.

    Raises:
        hydra.errors.ConfigCompositionException: a key that does not exist or a wrong type.
        ValueError: a value out of range (raised by the config dataclasses' ``__post_init__``, naming the key).
    """
    register_train_schema()
    job = [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=job)
    OmegaConf.resolve(cfg)
    OmegaConf.to_object(cfg)
    return cfg


def plan(overrides: Sequence[str]) -> list[tuple[list[str], DictConfig]]:
    """Every job of the sweep with its composed config."""
    return [(job, compose_job(job)) for job in expand_sweep(overrides)]


def _value(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key)
    return list(value) if OmegaConf.is_list(value) else value


def main(argv: list[str] | None = None) -> int:
    """Print the plan (one line per job), or every job's resolved config with ``--cfg``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", action="store_true", help="print each job's full resolved config")
    parser.add_argument("overrides", nargs="*", help="the train.py -m overrides")
    args = parser.parse_args(argv)
    jobs = plan(args.overrides)
    print(f"# {len(jobs)} job(s): python train.py -m {' '.join(args.overrides)}")
    for i, (job, cfg) in enumerate(jobs):
        sweep_part = [o for o in job if not o.startswith("hydra.")]
        print(f"[{i}] {' '.join(sweep_part)}")
        print("    " + ", ".join(f"{k}={_value(cfg, k)}" for k in PLAN_KEYS))
        if args.cfg:
            print(OmegaConf.to_yaml(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
