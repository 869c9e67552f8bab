"""The typed top-level config of ``eval.py`` (``conf/evaluate.yaml``), registered as ``evaluate_schema``."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from spp.eval.config import EvalConfig
from spp.job_base import CacheLockJobConfig, FabricJobConfig
from spp.loggers import LoggersConfig
from spp.models.config import ModelConfig
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.reconstruction.config import ReconstructConfig


@dataclass
class EvalJobConfig(CacheLockJobConfig, FabricJobConfig):
    """What ``eval.py`` evaluates: ``model.path=<dir>``, or model + pruner + sparsity (through the pruning cache) +
    optional ``adapter_dir``.

    Attributes:
        model: The model to load (a merged export is ``model.path=<run_dir>/merged``).
        pruner: Pruner applied before evaluation (``none`` = evaluate the weights as loaded).
        sparsity: Target pattern (``dense`` = no pruning).
        calibration: Calibration data of the pruner (part of the cache key).
        reconstruct: Block-wise reconstruction after pruning (``reconstruct=blockwise``: the base of an adapter a
            reconstructed run trained; its cache entry is reused).
        eval: What to measure (``conf/eval/*.yaml``).
        logger: Lightning loggers that receive the metrics and, on W&B, the table.
        adapter_dir: SPP adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) loaded
            on top of the (pruned) model; null = none.
        label: Row name in the table; null = ``<model.name> <pruner.name> <sparsity.name>[ +adapter]``.
        print_config: Print the resolved config as a Rich tree (always saved as
            ``<run_dir>/resolved_config.yaml``).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)
    sparsity: SparsityConfig = field(default_factory=SparsityConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    reconstruct: ReconstructConfig = field(default_factory=ReconstructConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggersConfig = field(default_factory=LoggersConfig)
    adapter_dir: str | None = None
    label: str | None = None
    print_config: bool = False


def register_eval_schema() -> None:
    """Store :class:`EvalJobConfig` as ``evaluate_schema`` in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="evaluate_schema", node=EvalJobConfig)
