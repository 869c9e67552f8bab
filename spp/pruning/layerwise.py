"""Layer-wise sparsity around any pruner: OWL (Yin et al., "Outlier Weighed Layerwise Sparsity", ICML 2024).

``sparsity.layerwise=owl`` (unstructured only) gives each decoder block its own ratio before the pruner runs:

1. a dense pass over the calibration windows, block by block (nothing pruned yet), measures each block's
   outlier ratio ``D_l``: the fraction of the scores ``A_ij = |W_ij| · ‖X_j‖₂`` of all its target matrices
   together that exceed ``M`` times their mean (paper Eq. 2, ``M`` = ``sparsity.owl_m``);
2. ``x_l = 2λ · (D_l - min D) / (max D - min D)`` and ``s_l = s - (x_l - mean x)`` (paper Eq. 3, the reference's
   normalisation): blocks with more outliers keep more weights, the ratios span ``2λ`` and their mean stays ``s``
   (every block holds the same number of target weights in the decoder families spp prunes).

The pruner then decides each matrix of block ``l`` at ratio ``s_l`` with its own rule. The pass runs on every rank
with the engine's split of the batches and sums the statistics across ranks, so every rank gets the same ratios.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from spp.distributed import DistContext
from spp.models.block_runner import BlockCalls, BlockRunner
from spp.pruning.config import SparsityConfig
from spp.pruning.statistics import InputStatistics
from spp.pruning.targets import block_linears


@dataclass
class LayerwiseRatios:
    """Each decoder block's pattern, and what decided it (``record`` goes to the report's overall line)."""

    blocks: list[SparsityConfig]
    outlier_ratio: list[float]

    def record(self, sparsity: SparsityConfig) -> dict[str, object]:
        """The report entry: method, λ, M, each block's outlier ratio (%) and sparsity."""
        return {"method": sparsity.layerwise, "owl_lambda": sparsity.owl_lambda, "owl_m": sparsity.owl_m,
                "outlier_ratio_pct": self.outlier_ratio, "block_sparsity": [b.target_ratio for b in self.blocks]}


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
    handles = [targets[n].register_forward_hook(lambda _m, inp, _o, s=stats[n]: s.add(inp[0])) for n in targets]
    outputs = []
    try:
        for b, x, (args, kw) in zip(batches, hidden, calls, strict=True):
            for s in stats.values():
                s.at_batch(b)
            out = block(x, *args, **kw)
            outputs.append(out[0] if isinstance(out, tuple) else out)
    finally:
        for h in handles:
            h.remove()
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
