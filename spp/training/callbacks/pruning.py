"""``PruningCallback``: prune the model (or load the cached pruned weights) in Lightning's ``setup`` hook."""

from __future__ import annotations

import time
from dataclasses import asdict, is_dataclass
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from spp.training.ppl_cache import cached_perplexity


def _plain(cfg: Any) -> Any:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    if is_dataclass(cfg):
        return asdict(cfg)
    return cfg


class PruningCallback(L.Callback):
    """Prune once per node through the cache, with a barrier before the other ranks read the cache.

    Local rank 0 of every node calls ``spp.pruning.get_or_prune`` (which prunes and writes the cache, or loads
    the cached pruned weights); after a barrier the other ranks call it too and hit the cache. Global rank 0
    also measures the dense and pruned perplexities (cached as well) when asked.

    Args:
        tokenizer: The model's tokenizer (calibration and perplexity).
        model_cfg: The ``model`` group (cache key and identity).
        pruner: The ``pruner`` group.
        sparsity: The ``sparsity`` group.
        calibration: The ``calibration`` group.
        cache_dir: Pruning cache root.
        data_dir: Data root override.
        eval_cfg: The ``eval`` group (perplexity settings); ``None`` skips perplexities.
        dense_ppl: Measure the dense model before pruning.
        pruned_ppl: Measure the pruned model before training.
    """

    def __init__(
        self,
        tokenizer: Any,
        model_cfg: Any,
        pruner: Any,
        sparsity: Any,
        calibration: Any,
        cache_dir: str,
        data_dir: str | None = None,
        eval_cfg: Any = None,
        dense_ppl: bool = True,
        pruned_ppl: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.model_cfg, self.pruner, self.sparsity, self.calibration = model_cfg, pruner, sparsity, calibration
        self.cache_dir, self.data_dir, self.eval_cfg = cache_dir, data_dir, eval_cfg
        self.dense_ppl, self.pruned_ppl = dense_ppl, pruned_ppl
        self.result: Any = None
        self.masks: dict[str, torch.Tensor] = {}
        self.ppl: dict[str, dict[str, Any]] = {}
        self.seconds: dict[str, float] = {}

    def _prune(self, model: torch.nn.Module, device: torch.device) -> Any:
        from spp.pruning import get_or_prune

        start = time.perf_counter()
        result = get_or_prune(
            model,
            self.tokenizer,
            _plain(self.model_cfg),
            _plain(self.pruner),
            _plain(self.sparsity),
            _plain(self.calibration),
            cache_dir=self.cache_dir,
            data_dir=self.data_dir,
            device=device,
        )
        self.seconds["prune_or_load"] = round(time.perf_counter() - start, 2)
        return result

    def _ppl(self, trainer: L.Trainer, model: torch.nn.Module, which: str, key: list[Any]) -> None:
        if self.eval_cfg is None or not self.eval_cfg.ppl or not trainer.is_global_zero:
            return
        self.ppl[which] = cached_perplexity(
            model, self.tokenizer, self.eval_cfg, self.data_dir, self.cache_dir, key, trainer.strategy.root_device
        )

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Prune ``pl_module.model`` in place (once; later ``setup`` calls are no-ops)."""
        if self.result is not None:
            return
        from spp.models import model_identity

        model = pl_module.model
        device = trainer.strategy.root_device
        if device.type != "cpu":
            model.to(device)
        identity = model_identity(_plain(self.model_cfg))
        prune_key = [_plain(self.pruner), _plain(self.sparsity), _plain(self.calibration)]
        if trainer.local_rank == 0:
            if self.dense_ppl:
                self._ppl(trainer, model, "dense", [identity])
            result = self._prune(model, device)
        trainer.strategy.barrier("spp_pruning")
        if trainer.local_rank != 0:
            result = self._prune(model, device)
        if self.pruned_ppl:
            self._ppl(trainer, model, "pruned", [identity, prune_key])
        self.result = result
        self.masks = {k: v.to(torch.bool).cpu() for k, v in result.masks.items()}
