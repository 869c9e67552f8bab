"""``PruningCallback``: pruning as a Lightning setup callback, on every rank, before ``configure_model`` shards.

The model is never whole on a device: rank 0 holds the weights in host memory, the others a ``meta`` skeleton,
and each decoder block visits the devices in turn (:func:`spp.pruning.cache.prune_cached`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import lightning as L
from torch import nn

from spp.adapters.base import AdapterMethod
from spp.adapters.config import AdapterConfig
from spp.distributed import DistContext
from spp.errors import UserError
from spp.eval.config import EvalConfig
from spp.eval.offloaded import cached_offloaded_perplexity
from spp.generation import generate_text
from spp.job_base import DEFAULT_LOCK_TIMEOUT_S
from spp.models.config import ModelConfig
from spp.models.conv1d import linearize_conv1d
from spp.models.identity import built_config, weights_fingerprint
from spp.models.loading import load_for_rank, load_tokenizer
from spp.models.offload import OffloadedModel
from spp.paths import default_cache_dir
from spp.pruning.base import Pruner
from spp.pruning.cache import READ_MARGIN_S, prune_cached
from spp.pruning.calibration_data import draw_calibration
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import PruneResult
from spp.pruning.masks import MaskSet, ZeroPattern
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.engine import ReconstructResult
from spp.pruning.reconstruction.phase import Probe, frozen_copy, probe, reconstruct_phase
from spp.report_text import ppl_with_interval
from spp.training.run import pruning_identity

log = logging.getLogger(__name__)


@dataclass
class PruningSettings:
    """What the pruning phase needs of a job's config.

    ``cache_dir=None`` still caches prunes under :func:`~spp.paths.default_cache_dir` (perplexities not cached);
    ``eval=None`` measures no perplexity; ``sample`` is one process only (other ranks would wait on rank 0);
    ``keep_dense`` keeps the frozen dense teacher for ``set_teacher``; ``adapter``: a method whose
    ``needs_dense(config)`` holds has its config completed after pruning (:func:`prepare_adapter`);
    ``identity``/``pruner_method``/``form``: the job's resolved ``Run`` values (``None``: resolved here).
    """

    model: ModelConfig
    pruner: PrunerConfig
    sparsity: SparsityConfig
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    cache_dir: str | None = None
    data_dir: str | None = None
    eval: EvalConfig | None = None
    dense_ppl: bool = True
    pruned_ppl: bool = True
    sample: tuple[str, int] | None = None
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    keep_dense: bool = False
    reconstruct: ReconstructConfig = field(default_factory=ReconstructConfig)
    pruner_method: Pruner | None = None
    form: AdapterMethod | None = None
    identity: Any = None
    adapter: tuple[AdapterMethod, AdapterConfig] | None = None


@dataclass
class PruningRecord:
    """What the report reads of the pruning phase: the prune result (cache hit, timings, report; rank 0), the
    ``dense`` / ``pruned`` / ``reconstructed`` perplexities, seconds by part, the completions (``sample``) and the
    reconstruction's result (``reconstruct=blockwise``)."""

    result: PruneResult
    ppl: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)
    reconstruction: ReconstructResult | None = None


@dataclass
class PrunedModel:
    """The pruning phase's result: the pruned (frozen, CPU) model, its masks and zero pattern, and its
    :class:`PruningRecord`. On ranks other than 0 ``model`` is the ``meta`` skeleton (unless restored everywhere)
    and the masks are empty; ``home`` (rank 0, sharded or DeepSpeed runs) holds the pruned weights by name, no copy,
    for :func:`spp.training.finalize.rebuild`; ``model`` is ``None`` once :func:`~spp.training.finalize.release`d.
    """

    model: nn.Module | None
    tokenizer: Any
    masks: MaskSet
    zeros: ZeroPattern
    record: PruningRecord
    home: dict[str, Any] = field(default_factory=dict)
    dense: nn.Module | None = None


def ppl_log_text(entry: dict[str, Any] | None) -> str:
    """``30.64 [27.1, 34.5] (wikitext2, seqlen 512, 8 windows; 41.2 s)`` — a perplexity entry in one log line."""
    if not entry:
        return "-"
    how = "cached" if entry.get("cache_hit") else f"{entry.get('seconds', 0):.1f} s"
    return (f"{ppl_with_interval(entry)} ({entry.get('source')}, seqlen {entry.get('seqlen')}, "
            f"{entry.get('windows')} windows; {how})")


def sample(prompt: str, max_new_tokens: int, model: nn.Module, tokenizer: Any) -> dict[str, Any]:
    """A greedy completion of ``prompt`` (Alpaca template), logged as it is made."""
    out = generate_text(model, tokenizer, prompt, max_new_tokens=max_new_tokens).summary()
    log.info("completion: %r", out["completion"])
    return out


def _ppl(off: OffloadedModel, tokenizer: Any, settings: PruningSettings, which: str,
         found: Probe | None = None) -> dict[str, Any]:
    """The dense, pruned or reconstructed perplexity over every rank, through the perplexity cache (a
    reconstruction without a cache entry is measured afresh: its weights have no key)."""
    if which == "reconstructed" and (found is None or found.digest is None):
        settings = dataclasses.replace(settings, cache_dir=None)
    weights = (found.digest if which == "reconstructed" and found.digest is not None else
               settings.identity.model if which == "dense" else settings.identity.pruned_weights)
    entry = cached_offloaded_perplexity(off, tokenizer, settings.eval, weights, settings.cache_dir, settings.data_dir)
    if off.ctx.is_main:
        log.info("%s perplexity: %s", which, ppl_log_text(entry))
    return entry


def prune_phase(settings: PruningSettings, model: nn.Module | None, tokenizer: Any, ctx: DistContext,
                everywhere: bool = True) -> PrunedModel:
    """Load (when ``model`` is None), measure, prune through the cache and measure again, on every rank."""
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    ctx.allow_long_waits(settings.lock_timeout_s + READ_MARGIN_S)  # before rank 0 reads, decides or writes alone
    if model is None:
        if ctx.is_main:
            log.info("prune phase: loading model %s", settings.model.name)
        model = load_for_rank(settings.model, ctx.rank)
        seconds["load_model"] = round(time.perf_counter() - start, 2)
    else:
        settings = identify_built(settings, model, ctx)
    if settings.identity is None:  # no Run gave it (or the model was built by the caller): the same, computed here
        settings = dataclasses.replace(settings, identity=pruning_identity(settings, settings.form))
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(settings.model)
    cache_dir = settings.cache_dir or str(default_cache_dir())
    keys = settings.identity.keys
    found = probe(settings.reconstruct, settings.model, settings.pruner, settings.sparsity, settings.calibration,
                  cache_dir, settings.data_dir, ctx, form=settings.form, keys=keys)
    dense = frozen_copy(model) if settings.keep_dense or found.needs_dense or settings.adapter else None
    samples = {}
    if settings.sample and not ctx.distributed:
        samples["dense"] = sample(*settings.sample, model, tokenizer)
    off = OffloadedModel(model, ctx)
    measure = settings.eval is not None and settings.eval.ppl
    ppl = {"dense": _ppl(off, tokenizer, settings, "dense")} if measure and settings.dense_ppl else {}
    t0 = time.perf_counter()
    if ctx.is_main:
        log.info("pruning: %s %s on %d rank(s) (calibration: %d × %d tokens of %s)", settings.pruner.name,
                 settings.sparsity.name, ctx.world, settings.calibration.nsamples, settings.calibration.seqlen,
                 settings.calibration.source)
    result = prune_cached(off, tokenizer, settings.model, settings.pruner, settings.sparsity, settings.calibration,
                          cache_dir, settings.data_dir, lock_timeout_s=settings.lock_timeout_s,
                          method=settings.pruner_method, entry_key=keys[0] if keys is not None else None)
    seconds["prune_or_load"] = round(time.perf_counter() - t0, 2)
    _log_result(result, settings, seconds["prune_or_load"], ctx)
    if measure and settings.pruned_ppl:
        ppl["pruned"] = _ppl(off, tokenizer, settings, "pruned")
    reconstruction = None
    if settings.reconstruct.enabled:
        t0 = time.perf_counter()
        reconstruction = reconstruct_phase(off, dense, tokenizer, result.masks, settings.pruner, found,
                                           settings.data_dir, settings.lock_timeout_s, settings.form)
        seconds["reconstruct_or_load"] = round(time.perf_counter() - t0, 2)
        dense = dense if settings.keep_dense or settings.adapter else None  # a copy made for reconstruction goes
        if measure:
            ppl["reconstructed"] = _ppl(off, tokenizer, settings, "reconstructed", found)
    model = off.restore(everywhere=everywhere)
    dense = prepare_adapter(settings, dense, model, tokenizer, ctx, seconds)
    if samples:
        samples["pruned"] = sample(*settings.sample, model, tokenizer)
    zeros = result.zeros if result.zeros is not None else ZeroPattern(result.masks)
    return PrunedModel(model, tokenizer, result.masks, zeros, PruningRecord(result, ppl, seconds, samples,
                                                                            reconstruction), dense=dense)


def prepare_adapter(settings: PruningSettings, dense: nn.Module | None, model: nn.Module, tokenizer: Any,
                    ctx: DistContext, seconds: dict[str, float]) -> nn.Module | None:
    """Complete ``settings.adapter``'s config (``AdapterMethod.prepare``): rank 0 measures on the calibration windows
    (``settings.calibration``), every rank sets the keys; returns the dense copy when the teacher still needs it."""
    if settings.adapter is None:
        return dense
    method, cfg = settings.adapter
    t0 = time.perf_counter()
    values = None
    if ctx.is_main:
        windows = draw_calibration(tokenizer, settings.calibration, settings.data_dir, announce=False).windows
        values = method.prepare(cfg, dense, model, list(windows.split(settings.calibration.batch_size)))
    values = ctx.broadcast_object(values, long_wait=True)
    for key, value in values.items():
        setattr(cfg, key, value)
    seconds["adapter_prepare"] = round(time.perf_counter() - t0, 2)
    if ctx.is_main and values:
        log.info("adapter %s: %s set from the dense and pruned models in %.1f s", method.name, sorted(values),
                 seconds["adapter_prepare"])
    return dense if settings.keep_dense else None


def identify_built(settings: PruningSettings, model: nn.Module, ctx: DistContext) -> PruningSettings:
    """``settings`` for a model the caller built: its ``Conv1D`` projections as ``nn.Linear`` (in place), keyed
    in the caches by rank 0's weights fingerprint, so a module never gets another model's cache entry."""
    linearize_conv1d(model)
    fingerprint = ctx.broadcast_object(weights_fingerprint(model) if ctx.is_main else None, long_wait=True)
    return dataclasses.replace(settings, model=built_config(settings.model, fingerprint), identity=None)


def module_network(module: nn.Module) -> tuple[str, nn.Module | None]:
    """The attribute of ``module`` holding the network to prune, and the network (``None``: to be loaded).

    ``module.model``, else its one decoder-LM child (``self.net``); two such children are refused: a guess.
    """
    model = getattr(module, "model", None)
    if isinstance(model, nn.Module):
        return "model", model
    found = [name for name, child in module.named_children()
             if getattr(getattr(child, "config", None), "num_hidden_layers", None) is not None]
    if len(found) > 1:
        raise UserError(f"the LightningModule holds {len(found)} language models ({', '.join(found)}) and no "
                        "`model`; the pruning callback cannot tell which one to prune",
                        "keep the network to prune in `self.model`")
    if found:
        return found[0], getattr(module, found[0])
    others = [name for name, child in module.named_children() if next(child.parameters(), None) is not None]
    if others and not hasattr(module, "model"):
        raise UserError(f"the LightningModule has no `model` and its networks ({', '.join(others)}) are not "
                        "decoder-only language models the pruning callback recognises",
                        "keep the network to prune in `self.model` (or set `self.model = None` to have the callback "
                        "load settings.model)")
    return "model", None


def _log_result(result: PruneResult, settings: PruningSettings, seconds: float, ctx: DistContext) -> None:
    if not ctx.is_main:
        return
    overall = result.report.overall
    log.info("pruned: %s %s, sparsity %.4f over %d matrices%s; %s in %.1f s (%s)", settings.pruner.name,
             settings.sparsity.name, overall.get("sparsity", float("nan")), overall.get("layers", 0),
             f", N:M valid: {overall['nm_valid']}" if overall.get("nm_valid") is not None else "",
             "cache hit" if result.cache_hit else "pruned", seconds, result.cache_path or "no cache")


class PruningCallback(L.Callback):
    """Prunes ``pl_module.model`` (or its one language model, :func:`module_network`) in ``setup`` on every rank.

    ``everywhere``: give every rank a full copy of the pruned model (``False``: rank 0 only, a ``meta`` skeleton
    elsewhere for ``configure_model`` to fill).
    """

    def __init__(self, settings: PruningSettings, tokenizer: Any = None, everywhere: bool = True) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.everywhere = everywhere
        self.pruned: PrunedModel | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Prune once per job (a second ``fit``/``validate`` on the same trainer re-uses the result)."""
        if self.pruned is not None:
            return
        ctx = DistContext.current(trainer.strategy.root_device)
        where, network = module_network(pl_module)
        self.pruned = prune_phase(self.settings, network, self.tokenizer, ctx, self.everywhere)
        setattr(pl_module, where, self.pruned.model)
        if hasattr(pl_module, "masks"):
            pl_module.masks = self.pruned.masks
        if self.pruned.dense is not None and hasattr(pl_module, "set_teacher"):
            pl_module.set_teacher(self.pruned.dense)  # the module owns it now: freed when training ends
            self.pruned.dense = None

    def run_alone(self, device: Any = None) -> PrunedModel:
        """The same phase without a Trainer, in this process on ``device`` (``adapter=none``: nothing to train)."""
        self.pruned = prune_phase(self.settings, None, self.tokenizer, DistContext.current(device), self.everywhere)
        return self.pruned
