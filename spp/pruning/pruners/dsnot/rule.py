"""DS⊘T (Zhang et al., ICLR 2024): training-free refinement of a sparse mask, e_i = Σ_{j pruned} W_ij · s_j.
Each cycle a row regrows one weight and prunes one; without the reference's sign check a row can overshoot, so each
row returns its smallest-|e_i| state seen and Σ_i |e_i| never rises."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spp.pruning.config import SparsityConfig
from spp.pruning.patterns import keep_top_n_of_m, prune_lowest_per_row
from spp.pruning.threads import one_cpu_thread

_VAR_EPS = 1e-12


@dataclass
class DSnoTOutcome:
    """Refined keep-mask with the per-row expected reconstruction error before and after, and cycles run."""

    mask: torch.Tensor
    error_before: torch.Tensor
    error_after: torch.Tensor
    cycles: int


def expected_error(weight: torch.Tensor, sequence_sum: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per-row expected reconstruction error e_i = Σ_{j pruned} W_ij · s_j (DS⊘T's objective is Σ_i |e_i|)."""
    c = weight.detach().float() * sequence_sum.float().reshape(1, -1)
    return (c * (~keep)).sum(1)


def _best_state(
    initial: torch.Tensor, errors: list[torch.Tensor], swaps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """Replay every row's swaps up to the cycle where its |e| was smallest."""
    best = torch.stack(errors).abs().argmin(0)
    keep = initial.clone()
    rows = torch.arange(keep.shape[0], device=keep.device)
    for t, (regrow, prune, applied) in enumerate(swaps, start=1):
        take = applied & (t <= best)
        keep[rows[take], regrow[take]] = True
        keep[rows[take], prune[take]] = False
    return keep


def _prune_order(c: torch.Tensor, keep: torch.Tensor, wanda_metric: torch.Tensor, n_kept: int) -> torch.Tensor:
    """Unstructured DS⊘T: each row's kept weights in the order they are offered for pruning (reference order):
    sorted by Wanda metric, negative contributions first, zero ones next, positive ones last (reversed)."""
    kept_idx = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :n_kept]
    by_wanda = kept_idx.gather(1, torch.sort(wanda_metric.float().gather(1, kept_idx), dim=1, stable=True).indices)
    cb = c.gather(1, by_wanda)
    width = by_wanda.shape[1]
    pos = torch.arange(width, device=c.device).expand_as(cb)
    order_key = torch.where(cb < 0, pos, torch.where(cb > 0, 3 * width - pos, width + pos))
    return by_wanda.gather(1, torch.sort(order_key, dim=1, stable=True).indices)


def _next_to_prune(prune_list: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Take each row's next weight to prune from the top (error < 0) or the bottom of its list; moves the pointers."""
    ptr = torch.where(down, hi, lo).clamp(0, prune_list.shape[1] - 1)
    hi -= down.long()
    lo += (~down).long()
    return prune_list.gather(1, ptr.unsqueeze(1)).squeeze(1)


def _swap(keep: torch.Tensor, prunable: torch.Tensor | None, c: torch.Tensor, e: torch.Tensor, sign0: torch.Tensor,
          active: torch.Tensor, ok: torch.Tensor, r_idx: torch.Tensor, p_idx: torch.Tensor,
          check_sign: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Regrow ``r_idx`` and prune ``p_idx`` in every row still active whose error keeps its sign (when checked);
    ``keep``, ``prunable`` and ``active`` are updated in place. Returns the new errors and the applied rows."""
    rows = torch.arange(c.shape[0], device=c.device)
    e_after = e + c[rows, p_idx] - c[rows, r_idx]
    if check_sign:
        active &= (torch.sign(e_after) == sign0) | ~ok
    apply = active & ok
    keep[rows[apply], r_idx[apply]] = True
    keep[rows[apply], p_idx[apply]] = False
    if prunable is not None:
        prunable[rows[apply], p_idx[apply]] = float("inf")
    return torch.where(apply, e_after, e), apply


def _regrow_order(c: torch.Tensor, keep: torch.Tensor, var: torch.Tensor, n_pruned: int, power: float) -> torch.Tensor:
    """Each row's pruned weights in the order they are offered for regrowth: contribution / var^power, ascending."""
    pruned_idx = torch.sort(keep.to(torch.int8), dim=1, stable=True).indices[:, :n_pruned]
    regrow_key = c.gather(1, pruned_idx) / var.float().clamp_min(_VAR_EPS).pow(power)[pruned_idx]
    return pruned_idx.gather(1, torch.sort(regrow_key, dim=1, stable=True).indices)


def _prune_pointers(c: torch.Tensor, keep: torch.Tensor, wanda_metric: torch.Tensor,
                    n_kept: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unstructured: every row's kept weights in pruning order, and per-row pointers to its two ends."""
    rows = c.shape[0]
    prune_list = _prune_order(c, keep, wanda_metric, n_kept)
    pr_lo = torch.zeros(rows, dtype=torch.long, device=c.device)
    pr_hi = torch.full((rows,), prune_list.shape[1] - 1, dtype=torch.long, device=c.device)
    return prune_list, pr_lo, pr_hi


def _group_lowest(prunable: torch.Tensor, r_idx: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """N:M: the least important kept weight of each regrown weight's own group of m, and whether the group has one."""
    start = r_idx - r_idx % m
    low_val, low_off = prunable.gather(1, start.unsqueeze(1) + torch.arange(m, device=r_idx.device)).min(1)
    return start + low_off, torch.isfinite(low_val)


@torch.no_grad()
def dsnot_refine(
    weight: torch.Tensor,
    initial_metric: torch.Tensor,
    wanda_metric: torch.Tensor,
    sequence_sum: torch.Tensor,
    var: torch.Tensor,
    sparsity: SparsityConfig,
    max_cycles: int = 50,
    update_threshold: float = 0.1,
    pow_of_var_regrowing: float = 1.0,
    same_sign_check: bool = False,
) -> DSnoTOutcome:
    """Build the initial mask from ``initial_metric`` (per row, or per N:M group) and refine it with DS⊘T.
    Regrowth ranks c_ij / σ²_j^``pow_of_var_regrowing``. Reference defaults: 50 cycles, threshold 0.1, pow 1."""
    with one_cpu_thread(weight.device):
        metric = initial_metric.detach().float()
        c = weight.detach().float() * sequence_sum.float().reshape(1, -1)
        rows, cols = c.shape
        n, m = sparsity.nm_pair
        nm = m is not None
        keep = keep_top_n_of_m(metric, n, m) if nm else prune_lowest_per_row(metric, sparsity.target_ratio)
        initial = keep.clone()
        e0 = (c * ~keep).sum(1)
        n_pruned = cols - int(keep[0].sum()) if rows else 0
        if n_pruned in (0, cols) or max_cycles == 0:
            return DSnoTOutcome(keep, e0, e0.clone(), 0)

        regrow_list = _regrow_order(c, keep, var, n_pruned, pow_of_var_regrowing)
        if not nm:
            prune_list, pr_lo, pr_hi = _prune_pointers(c, keep, wanda_metric, cols - n_pruned)
        else:  # the kept weights' metric, pruned positions at infinity (never chosen)
            prunable = metric.masked_fill(~keep, float("inf"))

        rg_lo = torch.zeros(rows, dtype=torch.long, device=c.device)
        rg_hi = torch.full((rows,), n_pruned - 1, dtype=torch.long, device=c.device)
        sign0 = torch.sign(e0)
        e = e0.clone()
        active = torch.ones(rows, dtype=torch.bool, device=c.device)
        errors, swaps = [e0.clone()], []
        for _ in range(max_cycles):
            active &= (e.abs() > update_threshold) & (rg_lo <= rg_hi)
            if not nm:
                active &= pr_lo <= pr_hi
            if not bool(active.any()):
                break
            up = e > 0
            r_idx = regrow_list.gather(1, torch.where(up, rg_hi, rg_lo).clamp(0, n_pruned - 1).unsqueeze(1)).squeeze(1)
            if nm:
                p_idx, ok = _group_lowest(prunable, r_idx, m)
            else:
                p_idx, ok = _next_to_prune(prune_list, pr_lo, pr_hi, e < 0), torch.ones_like(active)
            e, apply = _swap(keep, prunable if nm else None, c, e, sign0, active, ok, r_idx, p_idx,
                             nm or same_sign_check)
            rg_hi -= up.long()
            rg_lo += (~up).long()
            errors.append(e.clone())
            swaps.append((r_idx, p_idx, apply))
        final = _best_state(initial, errors, swaps) if swaps else keep
        return DSnoTOutcome(final, e0, (c * ~final).sum(1), len(swaps))  # one swap step per cycle
