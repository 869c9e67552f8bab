"""The typed top-level config of ``eval.py`` (``conf/evaluate.yaml``), registered as ``evaluate_schema``."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from spp.eval.config import EvalConfig
from spp.job_base import CacheLockJobConfig, FabricJobConfig
from spp.loggers import LoggersConfig
from spp.pruning.config import PrunedModelGroups


@dataclass
class EvalJobConfig(PrunedModelGroups, CacheLockJobConfig, FabricJobConfig):
    """What ``eval.py`` evaluates: ``model.path=<dir>``, or model + pruner + sparsity (through the pruning cache) +
    optional ``adapter_dir`` (the groups are :class:`~spp.pruning.config.PrunedModelGroups`').

    Attributes:
        eval: What to measure (``conf/eval/*.yaml``).
        logger: Lightning loggers that receive the metrics and, on W&B, the table.
        adapter_dir: SPP adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) loaded
            on top of the (pruned) model; null = none.
        label: Row name in the table; null = ``<model.name> <pruner.name> <sparsity.name>[ +adapter]``.
        print_config: Print the resolved config as a Rich tree (always saved as
            ``<run_dir>/resolved_config.yaml``).
    """

    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggersConfig = field(default_factory=LoggersConfig)
    adapter_dir: str | None = None
    label: str | None = None
    print_config: bool = False


def register_eval_schema() -> None:
    """Store :class:`EvalJobConfig` as ``evaluate_schema`` in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="evaluate_schema", node=EvalJobConfig)
