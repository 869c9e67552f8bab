"""Per-block sparsity ratios around any pruner: OWL (Yin et al., ICML 2024, Eqs. 2-3, the reference's
normalisation) and LoSA's RMI (Huang et al., ICLR 2025: linear CKA between blocks, then its linear programme solved
exactly). The dense pass runs on every rank and sums statistics across ranks, so every rank gets the same ratios."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from spp.distributed import DistContext
from spp.models.block_runner import BlockCalls, BlockRunner
from spp.projections import block_linears
from spp.pruning.config import SparsityConfig
from spp.pruning.statistics import InputStatistics, observe_inputs


@dataclass
class LayerwiseRatios:
    """Each decoder block's pattern, and what decided it (``record`` goes to the report's overall line): OWL's
    outlier ratios, or LoSA's RMI importances."""

    blocks: list[SparsityConfig]
    outlier_ratio: list[float] = dataclasses.field(default_factory=list)
    rmi_importance: list[float] = dataclasses.field(default_factory=list)

    def record(self, sparsity: SparsityConfig) -> dict[str, object]:
        """The report entry: method, its settings and per-block values, each block's sparsity."""
        ratios = [b.target_ratio for b in self.blocks]
        if sparsity.layerwise == "rmi":
            return {"method": "rmi", "rmi_delta": sparsity.rmi_spread, "rmi_importance": self.rmi_importance,
                    "block_sparsity": ratios}
        return {"method": sparsity.layerwise, "owl_lambda": sparsity.owl_lambda, "owl_m": sparsity.owl_m,
                "outlier_ratio_pct": self.outlier_ratio, "block_sparsity": ratios}


def outlier_ratio(scores: list[torch.Tensor], m: float) -> float:
    """OWL's ``D_l`` in percent: the share of all entries of ``scores`` (one block's matrices) above ``m`` × mean."""
    flat = torch.cat([s.reshape(-1).float() for s in scores])
    return float((flat > flat.mean() * m).sum()) / flat.numel() * 100.0


def owl_ratios(outliers: list[float], target: float, lam: float) -> list[float]:
    """Per-block sparsity ``s_l = s - (x_l - mean x)``, ``x_l = 2λ (D_l - min D)/(max D - min D)`` (Eq. 3); equal
    outlier ratios give ``s`` everywhere."""
    d = torch.tensor(outliers, dtype=torch.float64)
    span = float(d.max() - d.min())
    x = (d - d.min()) / span * (2.0 * lam) if span > 0 else torch.zeros_like(d)
    return [float(v) for v in target - (x - x.mean())]


def block_patterns(sparsity: SparsityConfig, ratios: list[float]) -> list[SparsityConfig]:
    """One unstructured pattern per block at its ratio (named like the job's, e.g. ``unstructured0.7``)."""
    return [dataclasses.replace(sparsity, layerwise="none", ratio=r) for r in ratios]


def _block_scores(block: nn.Module, targets: dict[str, nn.Linear], hidden: list[torch.Tensor], calls: list,
                  ctx: DistContext, batches: list[int], nbatches: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``|W| · ‖X‖₂`` of each target of the dense ``block`` over this rank's batches (summed over ranks), and the
    block's outputs (the next block's dense inputs)."""
    stats = {n: InputStatistics(lin.in_features, ctx.device) for n, lin in targets.items()}
    outputs: list[torch.Tensor] = []
    observe_inputs(block, targets, stats, batches, hidden, calls, outputs)
    scores = []
    for n, lin in targets.items():
        stats[n].reduce(ctx, nbatches)
        scores.append(lin.weight.detach().abs().float() * stats[n].input_norm_sq.sqrt().reshape(1, -1))
    return scores, outputs


@torch.no_grad()
def owl_block_sparsity(runner: BlockRunner, targets: list[str], sparsity: SparsityConfig, hidden: list[torch.Tensor],
                       calls: BlockCalls, batches: list[int], nbatches: int) -> LayerwiseRatios:
    """OWL's per-block patterns from a dense pass (module docstring); ``hidden``/``calls``: block 0's inputs of this
    rank's ``batches`` (of ``nbatches`` in all), as :meth:`BlockRunner.head` gives them (consumed)."""
    outliers: list[float] = []
    for i in range(len(runner.layers)):
        with runner.block(i) as block:
            scores, hidden = _block_scores(block, block_linears(block, targets), hidden, calls[i], runner.off.ctx,
                                           batches, nbatches)
        outliers.append(outlier_ratio(scores, float(sparsity.owl_m)) if scores else 0.0)
    ratios = owl_ratios(outliers, sparsity.target_ratio, float(sparsity.owl_lambda))
    return LayerwiseRatios(block_patterns(sparsity, ratios), outliers)


def linear_cka(gram_x: torch.Tensor, gram_y: torch.Tensor) -> float:
    """Linear CKA of two sets of features from their Gram matrices ``X Xᵀ``, ``Y Yᵀ`` (Kornblith et al. 2019, the
    biased HSIC): ``⟨H K H, H L H⟩ / (‖H K H‖ ‖H L H‖)`` with ``H`` the centring matrix."""
    def centred(gram: torch.Tensor) -> torch.Tensor:
        g = gram.double()
        return g - g.mean(dim=0, keepdim=True) - g.mean(dim=1, keepdim=True) + g.mean()

    kx, ky = centred(gram_x), centred(gram_y)
    return float((kx * ky).sum() / (kx.norm() * ky.norm()))


def rmi_importance(grams: list[torch.Tensor]) -> list[float]:
    """``exp(-t_l)`` with ``t_l = Σ_{k≠l} CKA_lk`` over all ``Σ_l t_l`` (module docstring)."""
    n = len(grams)
    cka = [[linear_cka(grams[i], grams[j]) if i != j else 0.0 for j in range(n)] for i in range(n)]
    total = [sum(row) for row in cka]
    norm = sum(total)
    return [math.exp(-t / norm) if norm > 0 else 1.0 for t in total]


def rmi_ratios(importance: list[float], target: float, delta: float) -> list[float]:
    """The optimum of ``min Σ_l s_l · importance_l`` with ``mean s_l = target`` and ``s_l ∈ [target ± delta]``: the
    least important blocks first take the most sparsity (``target + delta``) until the mean is met."""
    ratios = [target - delta] * len(importance)
    extra = len(importance) * delta
    for i in sorted(range(len(importance)), key=lambda k: (importance[k], k)):
        step = min(2.0 * delta, extra)
        ratios[i] += step
        extra -= step
    return ratios


def _block_grams(runner: BlockRunner, hidden: list[torch.Tensor], calls: BlockCalls) -> list[torch.Tensor]:
    """The Gram matrix (windows x windows, float64) of every block's inputs over this process's windows, running the
    dense blocks one after the other."""
    grams = []
    for i in range(len(runner.layers)):
        x = torch.cat([h.reshape(h.shape[0], -1).double().cpu() for h in hidden])
        grams.append(x @ x.t())
        del x
        with runner.block(i) as block:
            hidden = runner.run(block, hidden, calls[i])
    return grams


@torch.no_grad()
def rmi_block_sparsity(runner: BlockRunner, sparsity: SparsityConfig, hidden: list[torch.Tensor],
                       calls: BlockCalls) -> LayerwiseRatios:
    """LoSA's per-block patterns from a dense pass (module docstring); one process only (the CKA compares every
    two windows, which several ranks would hold apart)."""
    if runner.off.ctx.distributed:
        raise ValueError("sparsity.layerwise=rmi compares every two calibration windows and runs on one process; "
                         "prune on one device (prune.py) or choose sparsity.layerwise=owl")
    importance = rmi_importance(_block_grams(runner, hidden, calls))
    ratios = rmi_ratios(importance, sparsity.target_ratio, sparsity.rmi_spread)
    return LayerwiseRatios(block_patterns(sparsity, ratios), rmi_importance=importance)


def layerwise_ratios(runner: BlockRunner, targets: list[str], sparsity: SparsityConfig, hidden: list[torch.Tensor],
                   calls: BlockCalls, batches: list[int], nbatches: int) -> LayerwiseRatios:
    """The per-block patterns ``sparsity.layerwise`` names (``owl`` or ``rmi``), from a dense pass."""
    if sparsity.layerwise == "rmi":
        return rmi_block_sparsity(runner, sparsity, hidden, calls)
    return owl_block_sparsity(runner, targets, sparsity, hidden, calls, batches, nbatches)
