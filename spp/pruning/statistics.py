"""Running statistics of a linear layer's inputs, accumulated over calibration sequences by forward hooks."""

from __future__ import annotations

import torch


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
        self.nsamples = 0
        self.ntokens = 0
        self.sq_sum = torch.zeros(in_features, dtype=torch.float64, device=device)
        self.xtx = torch.zeros(in_features, in_features, dtype=torch.float32, device=device) if hessian else None
        self.sum = torch.zeros(in_features, dtype=torch.float64, device=device) if moments else None

    @torch.no_grad()
    def add(self, x: torch.Tensor) -> None:
        """Add a batch of inputs shaped (batch, seq, in_features) or (seq, in_features)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input width {x.shape[-1]} does not match in_features={self.in_features}")
        batch = x.shape[0] if x.dim() == 3 else 1
        flat = x.reshape(-1, self.in_features).float()
        self.nsamples += batch
        self.ntokens += flat.shape[0]
        self.sq_sum += (flat**2).sum(0).double()  # fp32 within a batch, fp64 across batches
        if self.xtx is not None:
            self.xtx.addmm_(flat.t(), flat)
        if self.sum is not None:
            self.sum += flat.sum(0).double()

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
