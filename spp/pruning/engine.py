"""Sequential, block-by-block pruning of a decoder-only LM (the driver of Wanda, SparseGPT and DS⊘T).

The inputs of decoder block 0 are caught with a forward pre-hook (hidden states plus whatever keyword arguments
the model passes its blocks: attention mask, ``position_embeddings``, ``position_ids``, ...). Then, for each block:
collect input statistics of its target linears while running the (still dense) block, prune them, and re-run the
*pruned* block to produce the next block's inputs. Only one block and the calibration activations are on
``device`` at a time; the rest of the model stays where it is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from spp.errors import UserError
from spp.pruning.calibration_data import calibration_windows
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.methods import prune_matrix, statistics_for
from spp.pruning.patterns import check_layer_fits
from spp.pruning.report import PruneReport, build_report
from spp.pruning.statistics import InputStatistics
from spp.pruning.targets import block_linears, decoder_layers, target_linears

TRUE_SEQUENTIAL_GROUPS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("o_proj",),
    ("gate_proj", "up_proj"),
    ("down_proj",),
)


@dataclass
class PruneResult:
    """What pruning produced.

    Attributes:
        masks: Qualified linear name (``model.layers.0.self_attn.q_proj``) -> bool keep-mask (True = kept).
        report: Per-layer and overall sparsity audit.
        timings: Wall seconds per phase (``calibration_data``, ``capture``, ``statistics``, ``pruning``,
            ``propagate``, ``total``; ``cache_load`` on a cache hit).
        cache_hit: Whether the result came from the pruning cache.
        cache_path: The cache entry used or written (None without a cache).
    """

    masks: dict[str, torch.Tensor]
    report: PruneReport
    timings: dict[str, float] = field(default_factory=dict)
    cache_hit: bool = False
    cache_path: str | None = None


class _Caught(Exception):
    """Raised by the block-0 pre-hook to stop the forward pass once the inputs are stored."""


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` -> CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


@contextmanager
def _outside_blocks_on(model: nn.Module, blocks_prefix: str, device: torch.device) -> Iterator[None]:
    """Temporarily move every parameter and buffer outside the decoder blocks (embeddings, rotary) to ``device``."""
    moved: list[tuple[torch.Tensor, torch.device]] = []
    inside = blocks_prefix + "."
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if not name.startswith(inside) and tensor.device != device:
            moved.append((tensor, tensor.device))
            tensor.data = tensor.data.to(device)
    try:
        yield
    finally:
        for tensor, original in moved:
            tensor.data = tensor.data.to(original)


@torch.no_grad()
def capture_block_inputs(
    model: nn.Module, windows: torch.Tensor, batch_size: int, device: torch.device
) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """Run the model up to decoder block 0 and return its hidden-state inputs and keyword arguments per batch."""
    prefix, layers = decoder_layers(model)
    hidden: list[torch.Tensor] = []
    kwargs_list: list[dict[str, Any]] = []

    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs.pop("hidden_states")
        hidden.append(x.detach())
        kwargs_list.append({k: v for k, v in kwargs.items() if k != "past_key_values"})
        raise _Caught

    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with _outside_blocks_on(model, prefix, device):
            for start in range(0, windows.shape[0], batch_size):
                try:
                    model(input_ids=windows[start : start + batch_size].to(device), use_cache=False)
                except _Caught:
                    pass
    finally:
        handle.remove()
    if len(hidden) != -(-windows.shape[0] // batch_size):
        raise RuntimeError("decoder block 0 was not reached for every calibration batch")
    return hidden, [_to(kw, device) for kw in kwargs_list]


def _run_block(block: nn.Module, hidden: list[torch.Tensor], kwargs: list[dict[str, Any]]) -> list[torch.Tensor]:
    outputs = []
    for x, kw in zip(hidden, kwargs, strict=True):
        out = block(x, **kw)
        outputs.append(out[0] if isinstance(out, tuple) else out)
    return outputs


def _all_true_masks(model: nn.Module, targets: list[str]) -> dict[str, torch.Tensor]:
    return {n: torch.ones_like(m.weight, dtype=torch.bool) for n, m in target_linears(model, targets).items()}


def _apply(linear: nn.Linear, mask: torch.Tensor, weight: torch.Tensor | None) -> None:
    with torch.no_grad():
        if weight is not None:
            linear.weight.copy_(weight.to(linear.weight.device, linear.weight.dtype))
        linear.weight.masked_fill_(~mask.to(linear.weight.device), 0)


def validate_for_model(
    model: nn.Module, pruner: PrunerConfig, sparsity: SparsityConfig, calibration: CalibrationConfig
) -> dict[str, nn.Linear]:
    """Check every setting against the model before any work; return the target linears.

    Raises:
        ValueError: bad ratio / N:M / blocksize / targets / seqlen, naming the config key or the layer.
    """
    pruner, sparsity, calibration = pruner.validate(), sparsity.validate(), calibration.validate()
    linears = target_linears(model, pruner.targets)
    if not sparsity.is_dense and pruner.name != "none":
        for name, linear in linears.items():
            check_layer_fits(name, linear.weight.shape, sparsity)
        if pruner.name == "sparsegpt" and sparsity.kind == "nm" and pruner.blocksize % int(sparsity.m):
            raise ValueError(f"pruner.blocksize={pruner.blocksize} must be a multiple of sparsity.m={sparsity.m}")
        if pruner.needs_calibration:
            max_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
            if max_pos is not None and calibration.seqlen > max_pos:
                raise ValueError(
                    f"calibration.seqlen={calibration.seqlen} exceeds the model's max_position_embeddings={max_pos}; "
                    f"set calibration.seqlen<={max_pos}"
                )
    return linears


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
    """Prune the target linears of ``model`` in place.

    Args:
        model: A decoder-only causal LM (LLaMA family); it may stay on CPU while blocks visit ``device``.
        tokenizer: Tokenizer for the calibration text (unused by ``none``/``magnitude``).
        pruner: Pruner config.
        sparsity: Sparsity pattern.
        calibration: Calibration settings (defaults: C4, 128 x 2048, seed 0).
        data_dir: Data root override (see ``spp.paths.find_data``).
        device: Where each block is processed; None = CUDA when available.

    Returns:
        ``PruneResult`` with keep-masks keyed by qualified name, the report and per-phase timings.
    """
    calibration = calibration if calibration is not None else CalibrationConfig()
    was_training = model.training
    model.eval()  # no dropout in the calibration forward passes
    try:
        return _prune_model(model, tokenizer, pruner, sparsity, calibration, data_dir, device)
    finally:
        model.train(was_training)


def _prune_model(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    pruner: PrunerConfig,
    sparsity: SparsityConfig,
    calibration: CalibrationConfig,
    data_dir: str | None,
    device: str | torch.device | None,
) -> PruneResult:
    t_start = time.perf_counter()
    linears = validate_for_model(model, pruner, sparsity, calibration)
    timings = {"calibration_data": 0.0, "capture": 0.0, "statistics": 0.0, "pruning": 0.0, "propagate": 0.0}
    if sparsity.is_dense or pruner.name == "none":
        masks = _all_true_masks(model, pruner.targets)
        timings["total"] = time.perf_counter() - t_start
        return PruneResult(masks, build_report({n: m.weight for n, m in linears.items()}, sparsity), timings)
    dev = resolve_device(device)
    masks: dict[str, torch.Tensor] = {}
    extras: dict[str, dict[str, Any]] = {}
    if not pruner.needs_calibration:
        for name, linear in tqdm(linears.items(), desc=f"{pruner.name} {sparsity.name}", unit="layer"):
            t0 = time.perf_counter()
            out = prune_matrix(name.rsplit(".", 1)[-1], linear.weight.to(dev), None, pruner, sparsity)
            _apply(linear, out.mask, out.weight)
            masks[name] = out.mask.to(linear.weight.device)
            extras[name] = {"seconds": time.perf_counter() - t0, **out.info}
        timings["pruning"] = time.perf_counter() - t_start
    else:
        _prune_sequentially(model, tokenizer, pruner, sparsity, calibration, data_dir, dev, masks, extras, timings)
        masks = {name: masks[name] for name in linears}
    timings["total"] = time.perf_counter() - t_start
    report = build_report({n: m.weight for n, m in linears.items()}, sparsity, extras)
    report.overall["timings"] = dict(timings)
    return PruneResult(masks, report, timings)


def _prune_sequentially(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    pruner: PrunerConfig,
    sparsity: SparsityConfig,
    calibration: CalibrationConfig,
    data_dir: str | None,
    dev: torch.device,
    masks: dict[str, torch.Tensor],
    extras: dict[str, dict[str, Any]],
    timings: dict[str, float],
) -> None:
    """Calibrated pruning, block by block: catch block 0's inputs, then per block collect statistics, prune its
    linears and run the pruned block to produce the next block's inputs (DESIGN §2). Fills ``masks``/``extras``."""
    if tokenizer is None:
        raise ValueError(f"pruner={pruner.name} needs calibration data, so a tokenizer must be given")
    prefix, layers = decoder_layers(model)
    t0 = time.perf_counter()
    windows = calibration_windows(tokenizer, calibration, data_dir)
    timings["calibration_data"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    use_cache = getattr(model.config, "use_cache", None)
    model.config.use_cache = False
    try:
        hidden, kwargs = capture_block_inputs(model, windows, calibration.batch_size, dev)
    finally:
        model.config.use_cache = use_cache
    timings["capture"] = time.perf_counter() - t0
    for i, block in tqdm(list(enumerate(layers)), desc=f"{pruner.name} {sparsity.name}", unit="block"):
        home = next(block.parameters()).device
        block.to(dev)
        block_targets = block_linears(block, pruner.targets)
        for group in _sublayer_groups(block_targets, pruner.true_sequential):
            stats = _group_statistics(block, block_targets, group, hidden, kwargs, pruner, dev, timings)
            for n in group:
                t0 = time.perf_counter()
                linear = block_targets[n]
                out = prune_matrix(n.rsplit(".", 1)[-1], linear.weight, stats[n], pruner, sparsity)
                _apply(linear, out.mask, out.weight)
                qualified = f"{prefix}.{i}.{n}"
                masks[qualified] = out.mask
                extras[qualified] = {"seconds": time.perf_counter() - t0, **out.info}
                timings["pruning"] += extras[qualified]["seconds"]
            del stats
        t0 = time.perf_counter()
        hidden = _run_block(block, hidden, kwargs)
        timings["propagate"] += time.perf_counter() - t0
        block.to(home)
        for n in block_targets:
            masks[f"{prefix}.{i}.{n}"] = masks[f"{prefix}.{i}.{n}"].to(home)


def _sublayer_groups(block_targets: dict[str, nn.Linear], true_sequential: bool) -> list[list[str]]:
    """The linears calibrated together: all of them, or {q,k,v} -> {o} -> {gate,up} -> {down} (true sequential)."""
    groups = (
        [[n for n in block_targets if n.rsplit(".", 1)[-1] in g] for g in TRUE_SEQUENTIAL_GROUPS]
        if true_sequential
        else [list(block_targets)]
    )
    leftovers = [n for n in block_targets if not any(n in g for g in groups)]
    return [g for g in [*groups, leftovers] if g]


def _group_statistics(
    block: nn.Module,
    block_targets: dict[str, nn.Linear],
    group: list[str],
    hidden: Any,
    kwargs: dict[str, Any],
    pruner: PrunerConfig,
    dev: torch.device,
    timings: dict[str, float],
) -> dict[str, InputStatistics]:
    """Run ``block`` once with input hooks on the linears of ``group``; returns their calibration statistics."""
    t0 = time.perf_counter()
    stats = {n: statistics_for(pruner, block_targets[n].in_features, dev) for n in group}
    handles = [block_targets[n].register_forward_hook(lambda _m, inp, _o, s=stats[n]: s.add(inp[0])) for n in group]
    try:
        _run_block(block, hidden, kwargs)
    finally:
        for h in handles:
            h.remove()
    timings["statistics"] += time.perf_counter() - t0
    for n, s in stats.items():
        if not (bool(torch.isfinite(s.sq_sum).all()) and (s.xtx is None or bool(torch.isfinite(s.xtx).all()))):
            raise UserError(f"the calibration activations entering {n} are not finite (NaN or inf): nothing is "
                            "pruned or cached", "check the model's weights (model.path: a NaN in a norm or earlier "
                            "layer) and the calibration data (calibration.source)", key="model.path")
    return stats
