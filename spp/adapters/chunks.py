"""How large a transient m x n buffer an adapter's forward or backward may build at once, and the row-chunked
element-wise-modulated low-rank product ``x (M ⊙ (B A))ᵀ`` that ScaleLoRA (``M = W``) and SparsePEFT (``M = s·mask``)
compute with it (shared by the methods).
"""

from __future__ import annotations

from typing import Any

import torch

from spp.bitmask import unpack_bits

BACKWARD_CHUNK_ELEMENTS = 1 << 24
"""Largest transient buffer (elements) a chunked backward builds per chunk of rows: 2**24 fp32 = 64 MiB."""

MAX_DELTA_ELEMENTS = 1 << 27
"""Largest transient m x n product built in one piece (2**27: every projection of LLaMA-7B..30B, the fast GPU path)."""


def row_chunks(m: int, n: int, whole: int = MAX_DELTA_ELEMENTS, chunk: int = BACKWARD_CHUNK_ELEMENTS
               ) -> list[tuple[int, int]]:
    """Row ranges of an m x n matrix: one range when ``m * n <= whole``, else ranges of at most ``chunk`` elements."""
    if m * n <= whole:
        return [(0, m)]
    rows = max(1, chunk // max(n, 1))
    return [(lo, min(lo + rows, m)) for lo in range(0, m, rows)]


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a product with ``x`` runs in: autocast's when it is on (as ``F.linear`` would use), else ``x``'s."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def _modulate(t: torch.Tensor, modulator: torch.Tensor, lo: int, hi: int, scale: float | None) -> torch.Tensor:
    """Rows ``lo:hi`` of an m x n product times ``M`` in place: the weight rows (``scale=None``), else ``s·mask``."""
    if scale is None:
        return t.mul_(modulator[lo:hi].to(t.dtype))
    return t.mul_(scale).mul_(unpack_bits(modulator[lo:hi], t.shape[1]))


class ModulatedLowRankFunction(torch.autograd.Function):
    """``x (M ⊙ (B A))ᵀ + bias`` with hand-written gradients, in one chunk of rows or several for large layers.

    With ``P = (gᵀ x) ⊙ M``: ``dx = g (M ⊙ (B A))``, ``dB = P Aᵀ``, ``dA = Bᵀ P``; ``M`` stays frozen, and no m x n
    float survives the forward. ``modulator`` is the weight (``scale=None``) or the packed mask (``M = s·mask``).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, bias: torch.Tensor | None,
                modulator: torch.Tensor, scale: float | None) -> torch.Tensor:
        cdt = compute_dtype(x)
        m, n = lora_b.shape[0], lora_a.shape[1]
        with torch.autocast(x.device.type, enabled=False):
            x2, a, b = x.reshape(-1, n).to(cdt), lora_a.to(cdt), lora_b.to(cdt)
            y = x2.new_empty(x2.shape[0], m)
            for lo, hi in row_chunks(m, n):
                y[:, lo:hi] = x2 @ _modulate(b[lo:hi] @ a, modulator, lo, hi, scale).t()
            if bias is not None:
                y += bias.to(cdt)
        ctx.cdt, ctx.scale, ctx.bias_dtype = cdt, scale, bias.dtype if bias is not None else None
        ctx.save_for_backward(x, lora_a, lora_b, modulator)
        return y.view(*x.shape[:-1], m)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, lora_a, lora_b, modulator = ctx.saved_tensors
        need_x, need_a, need_b, need_bias = ctx.needs_input_grad[:4]
        cdt, scale, m, n = ctx.cdt, ctx.scale, lora_b.shape[0], lora_a.shape[1]
        g2, x2 = g.reshape(-1, m).to(cdt), x.reshape(-1, n).to(cdt)
        a, b = lora_a.to(cdt), lora_b.to(cdt)
        gx = torch.zeros_like(x2) if need_x else None
        ga = torch.zeros_like(a) if need_a else None
        gb = torch.empty_like(b) if need_b else None
        for lo, hi in row_chunks(m, n):
            if need_x:
                gx.addmm_(g2[:, lo:hi], _modulate(b[lo:hi] @ a, modulator, lo, hi, scale))
            if need_a or need_b:
                p = _modulate(g2[:, lo:hi].t() @ x2, modulator, lo, hi, scale)
                if need_b:
                    gb[lo:hi] = p @ a.t()
                if need_a:
                    ga.addmm_(b[lo:hi].t(), p)
                del p
        return (gx.view(x.shape).to(x.dtype) if need_x else None, ga.to(lora_a.dtype) if need_a else None,
                gb.to(lora_b.dtype) if need_b else None, g2.sum(0).to(ctx.bias_dtype) if need_bias else None,
                None, None)
