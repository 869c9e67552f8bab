"""Running statistics of a linear layer's inputs over calibration batches, summed across ranks exactly.
Sums add in fp64 in global batch order; X Xᵀ is summed as int64 on a fixed-point grid (:data:`FRACTION_BITS`)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from spp.distributed import DistContext
from spp.models.block_runner import Call, call_block

FRACTION_BITS = 42
"""Bits of a batch's Hessian kept below its bucket's power of two: with at most :data:`MAX_BATCHES` batches the
integer sum stays below 2**63."""
MAX_BATCHES = 2**20
"""The most calibration batches a Hessian may sum (checked at :meth:`InputStatistics.reduce`)."""
EXPONENT_GRID = 8
"""Bucket exponents are multiples of this: a few wide buckets (usually one per matrix), ≥ 34 bits per batch."""


def _bucket(gram: torch.Tensor) -> int | None:
    """The bucket exponent E of one batch's X Xᵀ (every |entry| < 2**E), ``None`` when all zero; non-finite raises."""
    top = float(gram.abs().max())
    if not math.isfinite(top):
        raise ValueError("non-finite input")
    if top == 0.0:
        return None
    exponent = int(torch.frexp(torch.tensor(top, dtype=torch.float64)).exponent)
    return -(-exponent // EXPONENT_GRID) * EXPONENT_GRID


def fixed_point(gram: torch.Tensor, exponent: int) -> torch.Tensor:
    """``gram`` (fp32, overwritten) scaled to multiples of 2**(exponent - FRACTION_BITS) and rounded (exact in fp32);
    a positive diagonal stays ≥ 1, so a feature that is ever non-zero is never taken for dead."""
    shift = FRACTION_BITS - exponent
    positive = gram.diagonal() > 0  # before scaling: a tiny entry scaled down underflows to 0
    while shift:  # in steps whose factor fp32 holds (a bucket far below 1 needs a factor above 2**127)
        step = max(-126, min(126, shift))
        gram.mul_(2.0**step)
        shift -= step
    gram.round_()
    diag = gram.diagonal()
    diag.copy_(torch.where(positive, diag.clamp_min(1.0), diag))
    return gram


ROWS_BYTES = 1 << 26
"""The int64 copy of a scaled Gram is made this many bytes of rows at a time (a small temporary, not a second
matrix)."""


def add_integers(total: torch.Tensor, scaled: torch.Tensor) -> None:
    """``total`` (int64) += ``scaled`` (fp32 holding integers), a block of rows at a time."""
    rows = max(1, ROWS_BYTES // (8 * scaled.shape[1]))
    for start in range(0, scaled.shape[0], rows):
        total[start : start + rows].add_(scaled[start : start + rows].to(torch.int64))


class InputStatistics:
    """Accumulates what the pruners need from the inputs X (tokens x in_features) of one linear layer.
    Normalised per calibration *sequence*, as the references (this fixes the scale of DS⊘T's update threshold)."""

    def __init__(self, in_features: int, device: torch.device | str, hessian: bool = False, moments: bool = False):
        self.in_features = in_features
        self.device = torch.device(device)
        self.nsamples = 0
        self.ntokens = 0
        self.sq_sum = torch.zeros(in_features, dtype=torch.float64, device=device)
        self.hessian_enabled = hessian
        self.xtx: dict[int, torch.Tensor] = {}  # bucket exponent -> exact int64 sum of the batches' fixed-point X Xᵀ
        self._xtx_finite = True
        self.sum = torch.zeros(in_features, dtype=torch.float64, device=device) if moments else None
        self._parts: dict[int, tuple[int, int, torch.Tensor, torch.Tensor | None]] = {}
        self._batch = 0

    def at_batch(self, index: int) -> InputStatistics:
        """Label the inputs added next as global calibration batch ``index`` (for the ordered cross-rank sum)."""
        self._batch = index
        return self

    @torch.no_grad()
    def add(self, x: torch.Tensor) -> None:
        """Add a batch of inputs shaped (batch, seq, in_features) or (seq, in_features)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input width {x.shape[-1]} does not match in_features={self.in_features}")
        batch = x.shape[0] if x.dim() == 3 else 1
        flat = x.reshape(-1, self.in_features).float()
        sq = (flat**2).sum(0)  # fp32 within a batch, fp64 across batches
        total = flat.sum(0) if self.sum is not None else None
        self._parts[self._batch] = (batch, flat.shape[0], sq, total)
        self.nsamples += batch
        self.ntokens += flat.shape[0]
        self.sq_sum += sq.double()
        if self.sum is not None:
            self.sum += total.double()
        if self.hessian_enabled:
            self._add_gram(flat.t() @ flat)

    def _add_gram(self, gram: torch.Tensor) -> None:
        """Add one batch's fp32 X Xᵀ exactly, in its bucket."""
        try:
            exponent = _bucket(gram)
        except ValueError:
            self._xtx_finite = False
            return
        if exponent is None:
            return
        scaled = fixed_point(gram, exponent)
        if exponent not in self.xtx:
            self.xtx[exponent] = torch.zeros(scaled.shape, dtype=torch.int64, device=scaled.device)
        add_integers(self.xtx[exponent], scaled)

    def reduce(self, ctx: DistContext, batches: int, owner: int | None = None) -> None:
        """Combine every rank's batches (``batches`` in all): vectors on every rank, X Xᵀ onto ``owner``
        (``None``: onto every rank). A no-op in one process, but for the bound on ``batches``."""
        if batches > MAX_BATCHES:
            raise ValueError(f"{batches} calibration batches exceed {MAX_BATCHES}; raise calibration.batch_size")
        if not ctx.distributed:
            return
        width = self.in_features * (2 if self.sum is not None else 1) + 2
        table = torch.zeros(batches, width, dtype=torch.float64, device=self.device)
        for index, (batch, tokens, sq, total) in self._parts.items():
            row = [sq.double()] + ([total.double()] if total is not None else [])
            table[index, :-2] = torch.cat(row)
            table[index, -2:] = torch.tensor([batch, tokens], dtype=torch.float64)
        ctx.all_reduce_(table)  # each row has one contributor: the sum is exact
        self.sq_sum.zero_()
        if self.sum is not None:
            self.sum.zero_()
        for row in table:  # fp64 additions in global batch order, as one process makes them
            self.sq_sum += row[: self.in_features]
            if self.sum is not None:
                self.sum += row[self.in_features : 2 * self.in_features]
        self.nsamples, self.ntokens = int(table[:, -2].sum()), int(table[:, -1].sum())
        if self.hessian_enabled:
            self._reduce_xtx(ctx, owner)

    def _reduce_xtx(self, ctx: DistContext, owner: int | None) -> None:
        """Sum every rank's buckets (the union of their exponents, in ascending order): exact integer sums."""
        exponents = sorted(set().union(*ctx.gather_objects(sorted(self.xtx))))
        zeros = (self.in_features, self.in_features)
        for exponent in exponents:
            part = self.xtx.get(exponent)
            if part is None:
                part = torch.zeros(zeros, dtype=torch.int64, device=self.device)
            self.xtx[exponent] = ctx.all_reduce_(part) if owner is None else ctx.reduce_(part, dst=owner)

    def _require(self, enabled: bool = True, flag: str = "") -> None:
        """Inputs were added, and the statistic asked for was accumulated (``flag``: its constructor switch)."""
        if self.nsamples == 0:
            raise RuntimeError("no calibration inputs reached this layer; did the block forward pass run?")
        if not enabled:
            raise RuntimeError(f"InputStatistics was created without {flag}=True")

    @property
    def input_norm_sq(self) -> torch.Tensor:
        """Wanda's ``scaler_row``: ‖X_j‖₂² over all tokens divided by the number of sequences (fp32)."""
        self._require()
        return (self.sq_sum / self.nsamples).float()

    @property
    def hessian(self) -> torch.Tensor:
        """SparseGPT's H = (2/N) Σ X Xᵀ over N calibration sequences (fp32, in x in)."""
        self._require(self.hessian_enabled, "hessian")
        total = torch.zeros(self.in_features, self.in_features, dtype=torch.float64, device=self.device)
        for exponent in sorted(self.xtx):  # a fixed order: the same bits on every rank count
            total.add_(self.xtx[exponent].double(), alpha=2.0 ** (exponent - FRACTION_BITS))
        return total.mul_(2.0 / self.nsamples).float()

    @property
    def sequence_sum(self) -> torch.Tensor:
        """DS⊘T's ``sum_metric_row``: mean over sequences of Σ_tokens x_j (fp32)."""
        self._require(self.sum is not None, "moments")
        return (self.sum / self.nsamples).float()

    @property
    def var(self) -> torch.Tensor:
        """Per-feature population variance over all tokens (fp32)."""
        self._require(self.sum is not None, "moments")
        mean = self.sum / self.ntokens
        return (self.sq_sum / self.ntokens - mean**2).clamp_min(0).float()

    def finite(self) -> bool:
        """Whether every accumulated statistic is finite (checked before anything is pruned)."""
        return bool(torch.isfinite(self.sq_sum).all()) and self._xtx_finite


def observe_inputs(block: nn.Module, linears: Mapping[str, nn.Linear], stats: dict[str, InputStatistics],
                   batches: list[int], hidden: list[torch.Tensor], calls: list[Call],
                   outputs: list[torch.Tensor] | None = None) -> None:
    """Run ``block`` on this rank's batches (global indices ``batches``) with each linear's inputs added to
    ``stats[name]``; with ``outputs``, the block's outputs are appended to it."""
    handles = [linears[n].register_forward_hook(lambda _m, inp, _o, s=s: s.add(inp[0])) for n, s in stats.items()]
    try:
        for b, x, call in zip(batches, hidden, calls, strict=True):
            for s in stats.values():
                s.at_batch(b)
            out = call_block(block, x, call)
            if outputs is not None:
                outputs.append(out)
    finally:
        for h in handles:
            h.remove()
