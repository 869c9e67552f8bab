"""Training: typed configs, the Lightning module, callbacks (pruning, audit, checkpoints, export), strategies,
loggers and the ``train.py`` pipeline."""

from spp.training.config import (
    LoggersConfig,
    StrategyConfig,
    TrainerConfig,
    TrainJobConfig,
    register_configs,
)
from spp.training.module import SPPModule
from spp.training.pipeline import run_training

__all__ = [
    "LoggersConfig",
    "SPPModule",
    "StrategyConfig",
    "TrainJobConfig",
    "TrainerConfig",
    "register_configs",
    "run_training",
]
