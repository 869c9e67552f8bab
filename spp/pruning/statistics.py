"""Running statistics of a linear layer's inputs, accumulated over calibration batches by forward hooks and
summed across ranks.

Each rank runs its share of the calibration batches (batch ``b`` belongs to rank ``b mod world``). The
per-feature sums (Wanda's ‖X_j‖², DS⊘T's Σ x_j) are kept per batch in fp32 and, at :meth:`reduce`, gathered and
added in fp64 in *global batch order*: exactly the additions one process makes, so the masks do not depend on the
number of ranks. The Hessian X Xᵀ (SparseGPT) is too large to keep per batch; each rank accumulates its batches
in fp32 and the partial sums are reduced onto the rank that solves the matrix (the order of that last sum is the
only difference from one process).
"""

from __future__ import annotations

import torch

from spp.distributed import DistContext


class InputStatistics:
    """Accumulates what the pruners need from the inputs X (tokens x in_features) of one linear layer.

    Sums are over every calibration token; normalisations are per calibration *sequence*, as in the
    reference repositories (this fixes the scale DS⊘T's update threshold is expressed in).

    Args:
        in_features: Width of the layer input.
        device: Where the accumulators live.
        hessian: Also accumulate X Xᵀ (SparseGPT).
        moments: Also accumulate the per-feature sum (DS⊘T's mean / variance / per-sequence sum).
    """

    def __init__(self, in_features: int, device: torch.device | str, hessian: bool = False, moments: bool = False):
        self.in_features = in_features
        self.device = torch.device(device)
        self.nsamples = 0
        self.ntokens = 0
        self.sq_sum = torch.zeros(in_features, dtype=torch.float64, device=device)
        self.xtx = torch.zeros(in_features, in_features, dtype=torch.float32, device=device) if hessian else None
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
        if self.xtx is not None:
            self.xtx.addmm_(flat.t(), flat)

    def reduce(self, ctx: DistContext, batches: int, owner: int | None = None) -> None:
        """Combine every rank's batches (``batches`` in all): vectors on every rank, X Xᵀ onto ``owner``
        (``None``: onto every rank). A no-op in one process."""
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
        if self.xtx is not None:
            if owner is None:
                ctx.all_reduce_(self.xtx)
            else:
                ctx.reduce_(self.xtx, dst=owner)

    def _require(self) -> None:
        if self.nsamples == 0:
            raise RuntimeError("no calibration inputs reached this layer; did the block forward pass run?")

    @property
    def input_norm_sq(self) -> torch.Tensor:
        """Wanda's ``scaler_row``: ‖X_j‖₂² over all tokens divided by the number of sequences (fp32)."""
        self._require()
        return (self.sq_sum / self.nsamples).float()

    @property
    def hessian(self) -> torch.Tensor:
        """SparseGPT's H = (2/N) Σ X Xᵀ over N calibration sequences (fp32, in x in)."""
        self._require()
        if self.xtx is None:
            raise RuntimeError("InputStatistics was created without hessian=True")
        return self.xtx * (2.0 / self.nsamples)

    @property
    def sequence_sum(self) -> torch.Tensor:
        """DS⊘T's ``sum_metric_row``: mean over sequences of Σ_tokens x_j (fp32)."""
        self._require()
        if self.sum is None:
            raise RuntimeError("InputStatistics was created without moments=True")
        return (self.sum / self.nsamples).float()

    @property
    def mean(self) -> torch.Tensor:
        """Per-feature mean over all tokens (fp32)."""
        self._require()
        if self.sum is None:
            raise RuntimeError("InputStatistics was created without moments=True")
        return (self.sum / self.ntokens).float()

    @property
    def var(self) -> torch.Tensor:
        """Per-feature population variance over all tokens (fp32)."""
        self._require()
        if self.sum is None:
            raise RuntimeError("InputStatistics was created without moments=True")
        mean = self.sum / self.ntokens
        return (self.sq_sum / self.ntokens - mean**2).clamp_min(0).float()

    def finite(self) -> bool:
        """Whether every accumulated statistic is finite (checked before anything is pruned)."""
        return bool(torch.isfinite(self.sq_sum).all()) and (self.xtx is None or bool(torch.isfinite(self.xtx).all()))
