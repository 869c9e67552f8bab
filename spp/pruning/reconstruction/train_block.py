"""Training one block's form on every rank: gradients summed across ranks at each step, so every rank takes the
1-process optimiser step (up to the order of float additions)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from spp.distributed import DistContext
from spp.pruning.reconstruction.config import ReconstructConfig, ReconstructSchedule
from spp.pruning.reconstruction.loss import window_losses

Forward = Callable[[int], torch.Tensor]
"""The block's output for this rank's local window ``j`` (its inputs and call arguments bound)."""


def lr_factor(step: int, steps: int, warmup: int, schedule: ReconstructSchedule) -> float:
    """The multiplier of ``reconstruct.lr`` at optimiser step ``step`` (0-based) of ``steps``: linear warm-up over
    ``warmup`` steps, then constant, linear decay to 0, or cosine decay to 0."""
    if warmup and step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule is ReconstructSchedule.constant:
        return 1.0
    done = (step - warmup) / max(1, steps - warmup)
    if schedule is ReconstructSchedule.linear:
        return max(0.0, 1.0 - done)
    return 0.5 * (1.0 + math.cos(math.pi * done))


@torch.no_grad()
def mean_loss(forward: Forward, targets: list[torch.Tensor], cfg: ReconstructConfig, ctx: DistContext,
              keep: list[torch.Tensor] | None = None) -> float:
    """The loss averaged over every window of every rank; with ``keep`` the outputs are appended to it."""
    total = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    for j, target in enumerate(targets):
        out = forward(j)
        total[0] += window_losses(out, target, cfg.loss).double().sum()
        total[1] += out.shape[0]
        if keep is not None:
            keep.append(out)
    ctx.all_reduce_(total)
    return float(total[0] / total[1])


def train_form(params: list[nn.Parameter], forward: Forward, targets: list[torch.Tensor], cfg: ReconstructConfig,
               ctx: DistContext, block: int, before_step: Callable[[], None] | None = None) -> int:
    """Train ``params`` so that ``forward`` matches ``targets`` (every rank together); returns the steps taken.
    The window order depends on ``reconstruct.seed`` and the block index only, so it is the same on every rank."""
    nsamples = cfg.nsamples
    steps = cfg.steps_per_block()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, steps, cfg.warmup_steps, ReconstructSchedule(cfg.schedule)))
    order = torch.Generator().manual_seed(cfg.seed * 1_000_003 + block)
    taken = 0
    for _ in range(cfg.epochs):
        perm = torch.randperm(nsamples, generator=order).tolist()
        for start in range(0, nsamples, cfg.batch_size):
            batch = perm[start:start + cfg.batch_size]
            opt.zero_grad(set_to_none=False)
            for sample in batch:
                if sample % ctx.world == ctx.rank:  # rank r holds windows r, r + N, ... (its local sample // N)
                    j = sample // ctx.world
                    (window_losses(forward(j), targets[j], cfg.loss).sum() / len(batch)).backward()
            _sum_gradients(params, ctx)
            if before_step is not None:
                before_step()  # the form's own rule (masked full: the pruned entries' gradients zeroed)
            opt.step()
            sched.step()
            taken += 1
    return taken


def _sum_gradients(params: list[nn.Parameter], ctx: DistContext) -> None:
    """Every parameter's gradient summed over the ranks (one flat buffer per dtype); a rank without windows adds 0."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not ctx.distributed:
        return
    by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
    for p in params:
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        ctx.all_reduce_(flat)
        offset = 0
        for p in group:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n
