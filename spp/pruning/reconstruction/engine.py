"""Block-wise reconstruction of a pruned model against its dense model, one decoder block at a time, on N ranks.
Per block: dense outputs become the targets (``targets=same_inputs``: on the pruned inputs, EBFT's target), the
pruned block trains its form with gradients summed over ranks, then merges it and is checked to keep every zero."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from spp.adapters.base import AdapterMethod
from spp.adapters.config import AdapterConfig
from spp.adapters.registry import option_config
from spp.errors import UserError
from spp.models.block_runner import BlockRunner, Call, buffers_on, call_block, in_eval_mode
from spp.models.config import DTYPES
from spp.models.offload import OffloadedModel
from spp.projections import block_linears, model_targets
from spp.pruning.calibration_data import draw_calibration
from spp.pruning.config import CalibrationConfig
from spp.pruning.masks import MaskSet
from spp.pruning.reconstruction.config import (
    ReconstructConfig,
    ReconstructInputs,
    ReconstructLoss,
    ReconstructTargets,
)
from spp.pruning.reconstruction.one_block import BLOCK_PATH, FormedBlock
from spp.pruning.reconstruction.train_block import mean_loss, train_form
from spp.pruning.resolve import form_method

log = logging.getLogger(__name__)


@dataclass
class ReconstructResult:
    """What reconstruction did.

    Attributes:
        blocks: Per block: ``block``, ``loss_start`` (pruned vs dense targets, on its training inputs), ``loss_end``
            (after training and merging), ``steps``, ``seconds``.
        timings: Wall seconds per phase (``cache_load`` on a hit) and ``cpu_seconds`` of the whole pass (rank 0).
        calibration: The draw's record (documents, file), as pruning records its own.
        cache_hit: Whether the reconstructed weights came from the cache.
        cache_path: The entry used or written.
        lr: The learning rate the blocks trained at (``reconstruct.lr`` or the form's own)."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    calibration: dict[str, Any] | None = None
    cache_hit: bool = False
    cache_path: str | None = None
    lr: float | None = None

    def summary(self) -> dict[str, Any]:
        """The record ``summary.json`` and ``prune.py``'s ``reconstruction.json`` hold."""
        start = [b["loss_start"] for b in self.blocks]
        end = [b["loss_end"] for b in self.blocks]
        return {"blocks": self.blocks, "timings": self.timings, "calibration": self.calibration,
                "cache_hit": self.cache_hit, "cache_path": self.cache_path, "lr": self.lr,
                "loss_start_mean": sum(start) / len(start) if start else None,
                "loss_end_mean": sum(end) / len(end) if end else None}


def calibration_of(cfg: ReconstructConfig) -> CalibrationConfig:
    """The windows the blocks train on, as a calibration config (the pruning engine's draw)."""
    return CalibrationConfig(source=cfg.source, path=cfg.path, nsamples=cfg.nsamples, seqlen=cfg.seqlen,
                             seed=cfg.seed, batch_size=1)


def form_config(cfg: ReconstructConfig, method: AdapterMethod | None = None) -> AdapterConfig:
    """The form's adapter config: ``conf/adapter/<form>.yaml`` with ``reconstruct.form_options`` over it.
    Raises ``UserError`` for an unknown form, one that trains nothing, or an option the form does not have."""
    if method is None:
        form_method(cfg.form)  # an unknown or untrained form is refused in one line
    try:
        return option_config(cfg.form, **dict(cfg.form_options))
    except Exception as err:  # noqa: BLE001 - OmegaConf's own errors name the key; one line for the user
        raise UserError(f"reconstruct.form_options={dict(cfg.form_options)} do not fit adapter={cfg.form}: "
                        f"{str(err).splitlines()[0]}", f"use keys of conf/adapter/{cfg.form}.yaml",
                        key="reconstruct.form_options") from err


def learning_rate(cfg: ReconstructConfig, method: AdapterMethod | None = None) -> float:
    """``reconstruct.lr``, or when it is null the form's own rate (``AdapterMethod.reconstruct_lr``; ``method``: the
    resolved form, or None)."""
    if cfg.lr is not None:
        return float(cfg.lr)
    return float((method if method is not None else form_method(cfg.form)).reconstruct_lr)


class _Pass:
    """One reconstruction pass: this rank's activations and the per-block steps."""

    def __init__(self, off: OffloadedModel, dense: OffloadedModel, masks: MaskSet, targets: list[str],
                 cfg: ReconstructConfig, method: AdapterMethod) -> None:
        cfg = dataclasses.replace(cfg, lr=learning_rate(cfg, method))
        self.off, self.ctx, self.cfg, self.masks, self.targets = off, off.ctx, cfg, masks, targets
        self.runner, self.dense_runner = BlockRunner(off), BlockRunner(dense)
        self.form = form_config(cfg, method)
        self.method = method
        self.dtype = DTYPES[cfg.dtype]
        self.timings = {"calibration_data": 0.0, "capture": 0.0, "dense": 0.0, "train": 0.0}
        self.blocks: list[dict[str, Any]] = []

    def capture(self, tokenizer: PreTrainedTokenizerBase, data_dir: str | None) -> tuple[list[torch.Tensor],
                                                                                          list[list[Call]]]:
        """This rank's windows entering block 0 (one window per forward), and each block's call arguments."""
        t0 = time.perf_counter()
        draw = draw_calibration(tokenizer, calibration_of(self.cfg), data_dir, announce=self.ctx.is_main)
        self.calibration = draw.record()
        self.timings["calibration_data"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        mine = self.ctx.mine(self.cfg.nsamples)
        hidden, calls = self.runner.head([draw.windows[j:j + 1] for j in mine])
        self.timings["capture"] = time.perf_counter() - t0
        return [h.to(self.dtype) for h in hidden], calls

    def dense_block(self, i: int, hidden: list[torch.Tensor], calls: list[Call]) -> list[torch.Tensor]:
        """The dense block ``i``'s outputs on the dense hidden states (the targets)."""
        t0 = time.perf_counter()
        with self.dense_runner.block(i) as block:
            block.to(self.dtype)
            out = self.dense_runner.run(block, hidden, calls)
        self.timings["dense"] += time.perf_counter() - t0
        return out

    def block_masks(self, block: nn.Module, prefix: str) -> dict[str, torch.Tensor]:
        """Rank 0's masks of the block's target linears, on every rank (named as in the one-block model)."""
        out = {}
        for name, linear in block_linears(block, self.targets).items():
            mask = (self.masks[f"{prefix}.{name}"].to(self.ctx.device, torch.uint8) if self.ctx.is_main else
                    torch.empty(linear.weight.shape, dtype=torch.uint8, device=self.ctx.device))
            out[f"{BLOCK_PATH}.{name}"] = self.ctx.broadcast_(mask, src=0).bool().cpu()
        return out

    def attach(self, formed: FormedBlock, i: int) -> list[nn.Parameter]:
        """Attach the form to block ``i``: its random start drawn from ``reconstruct.seed`` and the block's index
        (so the cache key fixes it), then rank 0's on every rank; no dropout (every rank computes the same step)."""
        devices = [self.ctx.device] if self.ctx.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.cfg.seed * 1_000_003 + i + 500_009)
            params = formed.attach()
        formed.wrapper.eval()
        self.method.after_placement(formed.wrapper)
        for param in params:
            self.ctx.broadcast_(param.data, src=0)
        return params

    def sparse_block(self, i: int, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                     calls: list[Call]) -> list[torch.Tensor]:
        """Train, merge, check and share pruned block ``i``; its outputs on ``inputs``."""
        prefix = f"{self.runner.prefix}.{i}"
        t0 = time.perf_counter()
        with self.runner.block(i, write_back=True) as block:
            block.to(self.dtype)
            formed = FormedBlock(block, self.form, self.block_masks(block, prefix))
            start = mean_loss(lambda j: call_block(block, inputs[j], calls[j]), targets, self.cfg, self.ctx)
            params = self.attach(formed, i)
            with torch.enable_grad():
                steps = train_form(params, lambda j: call_block(formed.block, inputs[j], calls[j]), targets, self.cfg,
                                   self.ctx, i, before_step=lambda: self.method.before_optimizer_step(formed.wrapper))
            formed.merge()
            _check_zeros(block, formed.masks, prefix)
            for param in block.parameters():  # rank 0's block on every rank: bit-identical from here on
                self.ctx.broadcast_(param.data, src=0)
            outputs: list[torch.Tensor] = []
            end = mean_loss(lambda j: call_block(block, inputs[j], calls[j]), targets, self.cfg, self.ctx, keep=outputs)
        seconds = time.perf_counter() - t0
        self.timings["train"] += seconds
        self.blocks.append({"block": i, "loss_start": start, "loss_end": end, "steps": steps,
                            "seconds": round(seconds, 3)})
        if self.ctx.is_main:
            change = 100.0 * (end - start) / start if start > 0 else 0.0
            log.info("reconstruct block %d/%d (%s): %s %.4g -> %.4g (%+.1f %%), %d steps, %.1f s", i + 1,
                     len(self.runner.layers), prefix, ReconstructLoss(self.cfg.loss).value, start, end, change, steps,
                     seconds)
        return outputs


def _check_zeros(block: nn.Module, masks: dict[str, torch.Tensor], prefix: str) -> None:
    """Every pruned weight of the merged block is exactly zero (else the form broke the pattern: stop)."""
    for name, module in block.named_modules():
        mask = masks.get(f"{BLOCK_PATH}.{name}")
        if mask is not None and bool((module.weight.detach()[~mask.to(module.weight.device)] != 0).any()):
            raise RuntimeError(f"reconstruction filled pruned weights of {prefix}.{name}: the form's merge broke the "
                               "sparsity pattern")


def reconstruct_offloaded(off: OffloadedModel, dense: OffloadedModel, tokenizer: PreTrainedTokenizerBase,
                          masks: MaskSet, pruner_targets: Any, cfg: ReconstructConfig, data_dir: str | None = None,
                          on_block: Callable[[str], None] | None = None,
                          form: AdapterMethod | None = None) -> ReconstructResult:
    """Reconstruct ``off`` (pruned) against ``dense`` block by block on every rank; rank 0's home ends reconstructed.
    ``masks`` are rank 0's pruning masks; ``on_block(prefix)`` is called once a block is final and written home."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    targets = model_targets(off.model, pruner_targets, "pruner.targets")
    run = _Pass(off, dense, masks, targets, cfg, form if form is not None else form_method(cfg.form))
    with (in_eval_mode(off.model), in_eval_mode(dense.model), buffers_on(off.model, off.ctx.device),
          buffers_on(dense.model, off.ctx.device)):
        dense_in, calls = run.capture(tokenizer, data_dir)
        use_sparse = ReconstructInputs(cfg.inputs) is ReconstructInputs.sparse
        same = use_sparse and ReconstructTargets(cfg.targets) is ReconstructTargets.same_inputs
        sparse_in = dense_in
        for i in range(len(run.runner.layers)):
            targets_i = run.dense_block(i, sparse_in if same else dense_in, calls[i])
            out = run.sparse_block(i, sparse_in if use_sparse else dense_in, targets_i, calls[i])
            sparse_in = out if use_sparse else sparse_in
            dense_in = [] if same else targets_i  # same_inputs: no dense trajectory is needed
            if on_block is not None:
                on_block(f"{run.runner.prefix}.{i}")
    run.timings["total"] = time.perf_counter() - t_start
    run.timings["cpu_seconds"] = time.process_time() - cpu_start  # this process's CPU time (all its threads)
    return ReconstructResult(run.blocks, {k: round(v, 3) for k, v in run.timings.items()}, run.calibration,
                             lr=run.cfg.lr)
