"""Dispatch one matrix to its pruner: returns the new weight (SparseGPT only) and the keep-mask."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.dsnot import dsnot_refine
from spp.pruning.magnitude import magnitude_mask
from spp.pruning.sparsegpt import inverse_hessian_factor, sparsegpt_prune
from spp.pruning.statistics import InputStatistics
from spp.pruning.wanda import wanda_mask, wanda_scores


@dataclass
class MatrixOutcome:
    """Pruning decision for one matrix; ``weight`` is None when only a mask is applied."""

    mask: torch.Tensor
    weight: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)


def statistics_for(pruner: PrunerConfig, in_features: int, device: torch.device | str) -> InputStatistics:
    """An ``InputStatistics`` collecting exactly what ``pruner`` needs."""
    hessian = pruner.name == "sparsegpt" or (pruner.name == "dsnot" and pruner.initial_method == "sparsegpt")
    return InputStatistics(in_features, device, hessian=hessian, moments=pruner.name == "dsnot")


def _dsnot_initial_metric(weight: torch.Tensor, stats: InputStatistics, pruner: PrunerConfig) -> torch.Tensor:
    if pruner.initial_method == "wanda":
        return wanda_scores(weight, stats.input_norm_sq)
    if pruner.initial_method == "magnitude":
        return weight.detach().abs().float()
    U, dead = inverse_hessian_factor(stats.hessian, pruner.percdamp)
    W = weight.detach().float().clone()
    W[:, dead] = 0
    return W**2 / torch.diag(U).reshape(1, -1) ** 2


def prune_matrix(
    leaf: str,
    weight: torch.Tensor,
    stats: InputStatistics | None,
    pruner: PrunerConfig,
    sparsity: SparsityConfig,
) -> MatrixOutcome:
    """Compute the pruning decision for one (out, in) weight.

    Args:
        leaf: Leaf name of the layer (``q_proj``), used to decide whether DS⊘T refines it.
        weight: The dense weight.
        stats: Input statistics (None for magnitude).
        pruner: Pruner settings.
        sparsity: Pattern.
    """
    if pruner.name == "magnitude":
        return MatrixOutcome(magnitude_mask(weight, sparsity))
    if stats is None:
        raise ValueError(f"pruner {pruner.name} needs calibration statistics")
    if pruner.name == "wanda":
        return MatrixOutcome(wanda_mask(weight, stats.input_norm_sq, sparsity))
    if pruner.name == "sparsegpt":
        out = sparsegpt_prune(weight, stats.hessian, sparsity, pruner.blocksize, pruner.percdamp)
        return MatrixOutcome(out.mask, out.weight, {"obs_loss": out.loss})
    if pruner.name == "dsnot":
        refine = leaf in set(pruner.refine_targets)
        res = dsnot_refine(
            weight,
            _dsnot_initial_metric(weight, stats, pruner),
            wanda_scores(weight, stats.input_norm_sq),
            stats.sequence_sum,
            stats.var,
            sparsity,
            max_cycles=pruner.max_cycles if refine else 0,
            update_threshold=pruner.update_threshold,
            pow_of_var_regrowing=pruner.pow_of_var_regrowing,
            same_sign_check=pruner.same_sign_check,
        )
        info = {
            "dsnot_refined": refine,
            "dsnot_cycles": res.cycles,
            "dsnot_error_before": float(res.error_before.abs().sum()),
            "dsnot_error_after": float(res.error_after.abs().sum()),
        }
        return MatrixOutcome(res.mask, None, info)
    raise ValueError(f"pruner.name={pruner.name!r} does not prune matrices")
