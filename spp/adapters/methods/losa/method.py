"""``adapter=losa``: LoSA (Huang et al., ICLR 2025): SparsePEFT's masked update with one rank per decoder block,
proportional to the block's reconstruction error; merged and saved as SparsePEFT.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spp.adapters.base import Masks
from spp.adapters.config import AdapterConfig
from spp.adapters.methods.losa.allocation import allocate_ranks, block_errors
from spp.adapters.methods.losa.config import LoSAConfig
from spp.adapters.methods.losa.layer import inject_losa, layer_ranks, load_losa
from spp.adapters.methods.sparse_lora.method import SparseLoRA
from spp.adapters.peft_base import lora_keys
from spp.projections import decoder_layers

log = logging.getLogger(__name__)


def block_ranks(model: nn.Module, cfg: LoSAConfig) -> list[int]:
    """One rank per decoder block from ``cfg.block_errors``, or ``cfg.r`` everywhere without them (or on ``meta``)."""
    blocks = len(decoder_layers(model)[1])
    meta = any(p.is_meta for p in model.parameters())
    if cfg.block_errors is None or meta:
        if cfg.block_errors is None and not meta and blocks > 1:
            log.warning("adapter=losa without adapter.block_errors: every block gets rank r=%d (SparsePEFT's update)",
                        cfg.r)
        return [cfg.r] * blocks
    if len(cfg.block_errors) != blocks:
        raise ValueError(f"adapter.block_errors has {len(cfg.block_errors)} entries but the model has {blocks} "
                         "decoder blocks; measure one error per block of this model")
    return allocate_ranks(cfg.block_errors, cfg.r, cfg.rank_min, cfg.ceiling)


class LoSA(SparseLoRA):
    """SparsePEFT's layers and files (merge keeps every zero; peft loads the folder masked) with per-block ranks."""

    name = "losa"
    config_class = LoSAConfig
    def needs_dense(self, cfg: AdapterConfig) -> bool:
        """The block errors are measured (from the dense and pruned models) unless they were given."""
        return cfg.block_errors is None

    def prepare(self, cfg: AdapterConfig, dense: nn.Module, pruned: nn.Module,
                batches: list[torch.Tensor]) -> dict[str, Any]:
        """``block_errors`` measured on the first ``error_windows`` calibration windows, unless they were given."""
        if cfg.block_errors is not None:
            return {}
        windows = torch.cat(batches)
        windows = windows[:cfg.error_windows] if cfg.error_windows else windows
        size = batches[0].shape[0]
        errors = block_errors(dense, pruned, list(windows.split(size)))
        log.info("losa: block errors on %d calibration windows: %s", windows.shape[0],
                 ", ".join(f"{e:.4g}" for e in errors))
        return {"block_errors": errors}

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        ranks = block_ranks(model, cfg)
        if not any(p.is_meta for p in model.parameters()):
            log.info("losa: block ranks %s (mean %.2f)", ranks, sum(ranks) / len(ranks))
        return inject_losa(model, masks, layer_ranks(model, tuple(cfg.targets), ranks), r=cfg.r,
                           alpha=cfg.lora_alpha, dropout=cfg.dropout, dtype=cfg.torch_dtype)

    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """peft's files (each layer's rank in ``rank_pattern``) plus ``sparse_lora.json`` (:func:`load_losa`)."""
        with self.refusing_other_files(directory):
            model, peft_cfg = load_losa(model, directory, masks)
        return model, LoSAConfig(**lora_keys(peft_cfg))


METHOD = LoSA()
