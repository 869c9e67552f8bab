"""Sequential, block-by-block pruning of a decoder-only LM on one or many ranks (DESIGN §2).
Batches are split round-robin over ranks and statistics summed; a Hessian rule (SparseGPT) is solved by one owner
rank per matrix and broadcast, so every rank ends with bit-identical weights; the model is never whole on a device."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from spp.distributed import DistContext
from spp.errors import UserError
from spp.models.block_runner import BlockCalls, BlockRunner, Call, buffers_on, in_eval_mode
from spp.models.conv1d import linearize_conv1d
from spp.models.offload import OffloadedModel
from spp.projections import block_linears, find_projections, matches, model_targets
from spp.pruning.base import MatrixOutcome, Pruner
from spp.pruning.calibration_data import draw_calibration
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.layerwise import LayerwiseRatios, layerwise_ratios
from spp.pruning.masks import MaskSet, ZeroPattern, kept_zero_indices
from spp.pruning.patterns import check_layer_fits, sparsity_summary
from spp.pruning.report import PruneReport, report_from_layers
from spp.pruning.resolve import prunes, resolve_pruner
from spp.pruning.statistics import InputStatistics, observe_inputs

log = logging.getLogger(__name__)

TRUE_SEQUENTIAL_GROUPS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn"),
    ("o_proj", "out_proj", "dense", "attn.c_proj"),
    ("gate_proj", "up_proj", "gate_up_proj", "fc1", "c_fc"),
    ("down_proj", "fc2", "mlp.c_proj"),
)
"""The sublayer groups of ``true_sequential``: the projections reading the same input, in the order a block runs
them (LLaMA, Qwen, Mistral, Gemma; Phi-3's fused ones; OPT; GPT-2's, by in-block path where a leaf is shared)."""


@dataclass
class PruneResult:
    """What pruning produced (rank 0; ``masks`` on every rank with ``keep_masks``).

    Attributes:
        masks: Qualified linear name -> bool keep-mask (True = kept), stored packed.
        report: Per-layer and overall sparsity audit.
        timings: Wall seconds per phase (``calibration_data``, ``capture``, ``statistics``, ``pruning``,
            ``propagate``, ``total``; ``cache_load`` on a cache hit).
        cache_hit: Whether the result came from the pruning cache.
        cache_path: The cache entry used or written (None without a cache).
        zeros: The exact-zero pattern of the pruned weights (masks plus kept zeros)."""

    masks: MaskSet
    report: PruneReport
    timings: dict[str, float] = field(default_factory=dict)
    cache_hit: bool = False
    cache_path: str | None = None
    zeros: ZeroPattern | None = None


def local_context(device: str | torch.device | None) -> DistContext:
    """This process alone, on ``device`` (``None``: CUDA when available, else CPU)."""
    return DistContext(device=torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))


def validate_for_model(
    model: nn.Module, pruner: PrunerConfig, sparsity: SparsityConfig, calibration: CalibrationConfig,
    method: Pruner | None = None,
) -> tuple[dict[str, nn.Linear], Pruner | None]:
    """Check every setting against the model before any work (shapes only: a ``meta`` skeleton will do); the
    prunable linears and the pruner (``method``, else resolved; ``None`` when nothing is pruned).
    Raises ``ValueError`` naming the key or layer (targets, shapes, seqlen, :meth:`Pruner.check`; ranges: at build)."""
    linears = find_projections(model, pruner.targets, "pruner.targets")  # in decoder order; none matched: UserError
    method = (method or resolve_pruner(pruner)) if prunes(pruner, sparsity) else None
    if method is not None:
        for name, linear in linears.items():
            check_layer_fits(name, linear.weight.shape, sparsity)
        method.check(sparsity)
        if method.needs_calibration:
            max_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
            if max_pos is not None and calibration.seqlen > max_pos:
                raise ValueError(
                    f"calibration.seqlen={calibration.seqlen} exceeds the model's max_position_embeddings={max_pos}; "
                    f"set calibration.seqlen<={max_pos}"
                )
    return linears, method


@torch.no_grad()
def prune_model(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    pruner: PrunerConfig,
    sparsity: SparsityConfig,
    calibration: CalibrationConfig | None = None,
    data_dir: str | None = None,
    device: str | torch.device | None = None,
) -> PruneResult:
    """Prune the target linears of a whole in-memory ``model`` in place, in this process.
    The model is offloaded meanwhile and put back on its own device; GPT-2's ``Conv1D`` become ``nn.Linear`` in place.
    :func:`prune_offloaded` is the same on N ranks."""
    linearize_conv1d(model)  # a GPT-2 model built by the caller: its Conv1D projections as nn.Linear (a no-op else)
    off = OffloadedModel(model, local_context(device))
    try:
        return prune_offloaded(off, tokenizer, pruner, sparsity, calibration or CalibrationConfig(), data_dir)
    finally:
        off.restore()


def prune_offloaded(
    off: OffloadedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    pruner: PrunerConfig,
    sparsity: SparsityConfig,
    calibration: CalibrationConfig,
    data_dir: str | None = None,
    keep_masks: bool = False,
    on_block: Callable[[str], None] | None = None,
    method: Pruner | None = None,
) -> PruneResult:
    """Prune ``off`` block by block on every rank of ``off.ctx``; rank 0's home ends pruned.
    ``on_block(prefix)`` is called once each block is final and written home (the cache streams it to disk)."""
    t_start = time.perf_counter()
    model = off.model
    linears, method = validate_for_model(model, pruner, sparsity, calibration, method)
    if method is None:
        return _unpruned(off, linears, sparsity, t_start)
    with in_eval_mode(model), buffers_on(model, off.ctx.device):  # no dropout in the calibration forward passes
        run = _Run(off, method, sparsity, keep_masks or off.ctx.is_main, on_block)
        run.prune(tokenizer, calibration, data_dir, pruner.true_sequential)
    run.timings["total"] = time.perf_counter() - t_start
    report = report_from_layers(run.layers, sparsity, run.extras, timings=dict(run.timings),
                                calibration=run.calibration, layerwise=run.layerwise and run.layerwise.record(sparsity))
    return PruneResult(run.masks, report, run.timings, zeros=ZeroPattern(run.masks, run.kept_zeros))


def _unpruned(off: OffloadedModel, linears: dict[str, nn.Linear], sparsity: SparsityConfig,
              t_start: float) -> PruneResult:
    """``pruner=none`` / ``sparsity=dense``: all-True masks and the report of the weights as they are."""
    masks = MaskSet({n: torch.ones(m.weight.shape, dtype=torch.bool) for n, m in linears.items()})
    weights = {n: off.home[off.canonical(f"{n}.weight")] for n in linears} if off.ctx.is_main else {}
    timings = {"calibration_data": 0.0, "capture": 0.0, "statistics": 0.0, "pruning": 0.0, "propagate": 0.0,
               "total": time.perf_counter() - t_start}
    report = report_from_layers(sparsity_summary(weights, *sparsity.nm_pair)["layers"], sparsity,
                                timings=dict(timings))
    return PruneResult(masks, report, timings, zeros=ZeroPattern(masks, {
        n: kept_zero_indices(n, masks[n], w) for n, w in weights.items()}))


class _Run:
    """One pruning pass: the state the blocks fill in (masks, report rows, timings) and the per-block steps."""

    def __init__(self, off: OffloadedModel, pruner: Pruner, sparsity: SparsityConfig, keep: bool,
                 on_block: Callable[[str], None] | None = None) -> None:
        self.off, self.ctx, self.pruner, self.sparsity, self.keep = off, off.ctx, pruner, sparsity, keep
        self.on_block = on_block
        self.runner = BlockRunner(off)
        self.targets = model_targets(off.model, pruner.cfg.targets, "pruner.targets")
        self.masks = MaskSet()
        self.kept_zeros: dict[str, torch.Tensor] = {}
        self.layers: dict[str, dict[str, Any]] = {}
        self.extras: dict[str, dict[str, Any]] = {}
        self.timings = {"calibration_data": 0.0, "capture": 0.0, "statistics": 0.0, "pruning": 0.0, "propagate": 0.0}
        self.matrices = 0  # round-robin counter for owner ranks
        self.calibration: dict[str, Any] | None = None  # what the calibration draw took (CalibrationDraw.record)
        self.block_sparsity = sparsity  # the pattern of the block being pruned (per block with sparsity.layerwise)
        self.layerwise: LayerwiseRatios | None = None

    def prune(self, tokenizer: PreTrainedTokenizerBase | None, calibration: CalibrationConfig,
              data_dir: str | None, true_sequential: bool) -> None:
        """Capture block 0's inputs for this rank's batches (with a layer-wise setting, decide each block's ratio
        first: :mod:`spp.pruning.layerwise`), then prune block after block."""
        hidden, calls = self._calibrate(tokenizer, calibration, data_dir)
        desc = f"{self.pruner.name} {self.sparsity.name}"
        show = self.ctx.is_main
        lines = show and not sys.stderr.isatty()  # no bar is drawn in a file or a pipe: one log line per block
        for i in tqdm(range(len(self.runner.layers)), desc=desc, unit="block", **({} if show else {"disable": True})):
            t_block = time.perf_counter()
            self.block_sparsity = self.layerwise.blocks[i] if self.layerwise is not None else self.sparsity
            with self.runner.block(i, write_back=True) as block:
                targets = block_linears(block, self.targets)
                for group in sublayer_groups(targets, true_sequential):
                    stats = self.statistics(block, targets, group, hidden, calls[i])
                    self.decide(f"{self.runner.prefix}.{i}", group, targets, stats)
                if self.pruner.needs_calibration:
                    t0 = time.perf_counter()
                    hidden = self.runner.run(block, hidden, calls[i])
                    self.timings["propagate"] += time.perf_counter() - t0
            if lines:
                log.info("prune %s: block %d/%d (%s.%d) in %.1f s", desc, i + 1, len(self.runner.layers),
                         self.runner.prefix, i, time.perf_counter() - t_block)
            if self.on_block is not None:
                self.on_block(f"{self.runner.prefix}.{i}")

    def _calibrate(self, tokenizer: PreTrainedTokenizerBase | None, calibration: CalibrationConfig,
                   data_dir: str | None) -> tuple[list[torch.Tensor], BlockCalls]:
        """Draw the calibration windows and capture block 0's inputs of this rank's batches (nothing for a pruner
        without calibration); with ``sparsity.layerwise``, run its dense pass first (``self.layerwise``)."""
        self.batches: list[int] = []
        self.nbatches = 0
        owl = self.sparsity.layerwise != "none"
        if not (self.pruner.needs_calibration or owl):
            return [], [[] for _ in self.runner.layers]
        if tokenizer is None:
            raise ValueError(f"pruner={self.pruner.name} sparsity.layerwise={self.sparsity.layerwise} needs "
                             "calibration data, so a tokenizer must be given")
        t0 = time.perf_counter()
        draw = draw_calibration(tokenizer, calibration, data_dir, announce=self.ctx.is_main)
        windows, self.calibration = draw.windows, draw.record()
        self.timings["calibration_data"] = time.perf_counter() - t0
        batches = list(windows.split(calibration.batch_size))
        self.nbatches, self.batches = len(batches), self.ctx.mine(len(batches))
        t0 = time.perf_counter()
        hidden, calls = self.runner.head([batches[b] for b in self.batches])
        self.timings["capture"] = time.perf_counter() - t0
        if owl:
            t0 = time.perf_counter()
            self.layerwise = layerwise_ratios(self.runner, self.targets, self.sparsity, hidden, calls, self.batches,
                                              self.nbatches)
            self.timings["layerwise"] = time.perf_counter() - t0
            if not self.pruner.needs_calibration:  # magnitude with OWL: the activations served the ratios only
                return [], [[] for _ in self.runner.layers]
            hidden, calls = self.runner.head([batches[b] for b in self.batches])
        return hidden, calls

    def statistics(self, block: nn.Module, targets: dict[str, nn.Linear], group: list[str],
                   hidden: list[torch.Tensor], calls: list[Call]) -> dict[str, InputStatistics]:
        """Run this rank's batches through ``block`` with input hooks on ``group``; sum over the ranks."""
        if not self.pruner.needs_calibration:
            return {}
        t0 = time.perf_counter()
        stats = {n: self.pruner.statistics(targets[n].in_features, self.ctx.device) for n in group}
        observe_inputs(block, targets, stats, self.batches, hidden, calls)
        for k, n in enumerate(group):
            owner = self.ctx.owner(self.matrices + k) if self.pruner.uses_hessian else None
            stats[n].reduce(self.ctx, self.nbatches, owner)
        self.timings["statistics"] += time.perf_counter() - t0
        self._check_finite(stats, group)
        return stats

    def _check_finite(self, stats: dict[str, InputStatistics], group: list[str]) -> None:
        bad = torch.tensor([0 if all(s.finite() for s in stats.values()) else 1], device=self.ctx.device)
        if int(self.ctx.all_reduce_(bad)):  # every rank raises together
            raise UserError(f"the calibration activations entering {group} are not finite (NaN or inf): nothing is "
                            "pruned or cached", "check the model's weights (model.path: a NaN in a norm or earlier "
                            "layer) and the calibration data (calibration.source)", key="model.path")

    def decide(self, prefix: str, group: list[str], targets: dict[str, nn.Linear],
               stats: dict[str, InputStatistics]) -> None:
        """Prune the matrices of ``group`` on every rank and record them (Hessian rules: all owners at once,
        then each result broadcast from its owner in order)."""
        owned = self._solve_owned(group, targets, stats) if self.pruner.uses_hessian else {}
        for k, name in enumerate(group):
            t0 = time.perf_counter()
            linear = targets[name]
            if self.pruner.uses_hessian:
                out = self._share(self.ctx.owner(self.matrices + k), owned.get(k), linear)
            else:
                out = self.pruner.solve(name, linear.weight, stats.get(name), self.block_sparsity)
            weight = linear.weight
            if out.weight is not None:
                weight.copy_(out.weight.to(weight.device, weight.dtype))
            weight.masked_fill_(~out.mask.to(weight.device), 0)
            self._record(f"{prefix}.{name}", out, weight, time.perf_counter() - t0 + out.info.pop("_seconds", 0.0))
        self.matrices += len(group)

    def _record(self, qualified: str, out: MatrixOutcome, weight: torch.Tensor, seconds: float) -> None:
        self.timings["pruning"] += seconds
        if self.keep:
            self.masks.set(qualified, out.mask)
        if self.ctx.is_main:
            self.kept_zeros[qualified] = kept_zero_indices(qualified, out.mask, weight)
            self.layers.update(sparsity_summary({qualified: weight}, *self.sparsity.nm_pair)["layers"])
            self.extras[qualified] = {"seconds": seconds, **out.info}

    def _solve_owned(self, group: list[str], targets: dict[str, nn.Linear],
                     stats: dict[str, InputStatistics]) -> dict[int, MatrixOutcome | Exception]:
        """The outcomes of the matrices this rank owns in ``group`` (an error is kept, to be broadcast)."""
        owned: dict[int, MatrixOutcome | Exception] = {}
        for k, name in enumerate(group):
            if self.ctx.owner(self.matrices + k) != self.ctx.rank:
                continue
            t0 = time.perf_counter()
            try:
                owned[k] = self.pruner.solve(name, targets[name].weight, stats[name], self.block_sparsity)
                owned[k].info["_seconds"] = time.perf_counter() - t0
            except (ValueError, RuntimeError) as err:  # every rank must learn of it, not wait for the tensors
                owned[k] = err
        return owned

    def _share(self, owner: int, out: MatrixOutcome | Exception | None, linear: nn.Linear) -> MatrixOutcome:
        """The owner's outcome on every rank: its status first (an error ends every rank), then mask and weight."""
        status = {"error": out} if isinstance(out, Exception) else ({"info": out.info} if out is not None else None)
        status = self.ctx.broadcast_object(status, src=owner)
        if "error" in status:
            raise status["error"]
        weight = linear.weight.detach()
        mine = isinstance(out, MatrixOutcome)
        mask = out.mask.to(weight.device, torch.uint8) if mine else torch.empty(
            weight.shape, dtype=torch.uint8, device=weight.device)
        self.ctx.broadcast_(mask, src=owner)
        new = None
        if self.pruner.updates_weights:
            new = out.weight.to(weight.device, weight.dtype) if mine else torch.empty_like(weight)
            self.ctx.broadcast_(new, src=owner)
        return MatrixOutcome(mask.bool(), new, dict(status["info"]))


def sublayer_groups(block_targets: dict[str, nn.Linear], true_sequential: bool) -> list[list[str]]:
    """The linears calibrated together: all of them, or {q,k,v} -> {o} -> {gate,up} -> {down} (true sequential;
    :data:`TRUE_SEQUENTIAL_GROUPS`, matched by in-block path suffix, each linear in its first group; the ones no
    group names come last, together)."""
    if not true_sequential:
        return [list(block_targets)] if block_targets else []
    groups: list[list[str]] = [[] for _ in range(len(TRUE_SEQUENTIAL_GROUPS) + 1)]
    for name in block_targets:
        k = next((k for k, g in enumerate(TRUE_SEQUENTIAL_GROUPS) if matches(name, g)), len(TRUE_SEQUENTIAL_GROUPS))
        groups[k].append(name)
    return [g for g in groups if g]
