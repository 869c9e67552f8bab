"""SparseGPT: OBS-based pruning with lazy block updates (Frantar & Alistarh, 2023), H = (2/N) Σ X Xᵀ.
Dead inputs get H_jj = 1 and W[:, j] = 0; fp32, or float64 for a float64 weight
(``tests/test_sparsegpt_reference.py`` compares a float64 port of the paper's algorithm)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from spp.pruning.config import SparsityConfig
from spp.pruning.patterns import prune_lowest_global
from spp.pruning.threads import one_cpu_thread


@contextlib.contextmanager
def _no_tf32() -> Iterator[None]:
    """Disable TF32 matmuls (SparseGPT's numerics assume true fp32)."""
    old_matmul, old_cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old_matmul, old_cudnn


def inverse_hessian_factor(hessian: torch.Tensor, percdamp: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, dead)``: U the upper Cholesky factor of (H + λI)⁻¹, dead inputs set to H_jj = 1.
    Not positive definite after damping raises ``ValueError`` (increase ``pruner.percdamp``)."""
    H = hessian.detach().clone().to(_compute_dtype(hessian.dtype))
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    damp = percdamp * torch.mean(torch.diag(H))
    H.diagonal().add_(damp)
    try:
        L = torch.linalg.cholesky(H)
        U = torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)
    except torch.linalg.LinAlgError as err:
        raise ValueError(
            f"SparseGPT: the damped Hessian is not positive definite ({err}); increase pruner.percdamp "
            f"(now {percdamp}) or use more calibration data"
        ) from err
    return U, dead


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32, or float64 for float64 inputs (a reference comparison in the tests)."""
    return torch.promote_types(dtype, torch.float32)


@dataclass
class SparseGPTOutcome:
    """Result of pruning one matrix: updated weight (zeros where ``mask`` is False) and the OBS loss."""

    weight: torch.Tensor
    mask: torch.Tensor
    loss: float


@torch.no_grad()
def sparsegpt_prune(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    sparsity: SparsityConfig,
    blocksize: int = 128,
    percdamp: float = 0.01,
) -> SparseGPTOutcome:
    """Prune one (out, in) matrix with SparseGPT; the updated weight in the input dtype (fp32 arithmetic, TF32 off).
    N:M selects at every M-th column, per row, the M - N smallest w²/U_jj² of the next M columns."""
    n, m = sparsity.nm_pair
    if m is not None and blocksize % m:
        raise ValueError(f"pruner.blocksize={blocksize} must be a multiple of sparsity.m={sparsity.m} for N:M")
    with _no_tf32(), one_cpu_thread(weight.device):
        W = weight.detach().clone().to(_compute_dtype(weight.dtype))
        rows, cols = W.shape
        U, dead = inverse_hessian_factor(hessian.to(W.device, W.dtype), percdamp)
        W[:, dead] = 0
        pruned = torch.zeros_like(W, dtype=torch.bool)
        losses = torch.zeros(rows, dtype=W.dtype, device=W.device)
        for i1 in range(0, cols, blocksize):
            i2 = min(i1 + blocksize, cols)
            count = i2 - i1
            W1 = W[:, i1:i2].clone()
            Q1 = torch.zeros_like(W1)
            Err1 = torch.zeros_like(W1)
            U1 = U[i1:i2, i1:i2]
            d = torch.diag(U1)
            if sparsity.kind == "unstructured":  # one threshold over the column block
                mask1 = ~prune_lowest_global(W1**2 / d.reshape(1, -1) ** 2, sparsity.target_ratio)
            else:
                mask1 = torch.zeros_like(W1, dtype=torch.bool)
            for i in range(count):
                w = W1[:, i]
                if m is not None and i % m == 0:
                    score = W1[:, i : i + m] ** 2 / d[i : i + m].reshape(1, -1) ** 2
                    low = torch.sort(score, dim=1, stable=True).indices[:, : m - n]
                    mask1.scatter_(1, i + low, True)
                q = w.clone()
                q[mask1[:, i]] = 0
                Q1[:, i] = q
                losses += (w - q) ** 2 / d[i] ** 2 / 2
                err = (w - q) / d[i]
                W1[:, i:] -= err.unsqueeze(1) @ U1[i, i:].unsqueeze(0)
                Err1[:, i] = err
            W[:, i1:i2] = Q1
            pruned[:, i1:i2] = mask1
            W[:, i2:] -= Err1 @ U[i1:i2, i2:]
        keep = ~pruned
        W[pruned] = 0
    return SparseGPTOutcome(W.to(weight.dtype), keep, float(losses.sum()))
