"""Exact SPP forward/backward formulations (paper Eq. 5-7) as plain functions and one autograd Function.

``fused``: at most three full-size products, nothing m x n kept to backward; with ``P = G ⊙ W`` the gradients are
``dbeta_i = s Σ_c P[i,c] alpha[j(i),c]`` and ``dalpha_j = s Σ_{i in block j} beta_i P[i,c]``. ``fused_cached``
keeps ``W_eff``/``W'`` (one m x n tensor per layer) for two fewer m x n passes per step (``benchmarks/README.md``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from spp.adapters.chunks import BACKWARD_CHUNK_ELEMENTS, compute_dtype


def repeat_alpha(alpha: torch.Tensor, out_features: int) -> torch.Tensor:
    """``Repeat0(alpha, m / r)`` of Eq. 5: each row of ``alpha`` repeated ``m / r`` times (block repetition)."""
    return alpha.repeat_interleave(out_features // alpha.shape[0], dim=0)


def adapted_weight(weight: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
    """Eq. 5: ``W' = W ⊙ Repeat0(alpha, m/r) ⊙ beta`` (materialized, m x n); ``beta=None`` is one."""
    w = weight * repeat_alpha(alpha.to(weight.dtype), weight.shape[0])
    if beta is not None:
        w = w * beta.to(weight.dtype)
    return w


def merge_factor(alpha: torch.Tensor, beta: torch.Tensor | None, out_features: int, scale: float) -> torch.Tensor:
    """The m x n multiplier ``1 + s Repeat0(alpha) ⊙ beta`` of the merged weight ``W ⊙ (1 + s A beta)``."""
    r, n = alpha.shape
    k = out_features // r
    b = beta.reshape(r, k, 1) if beta is not None else alpha.new_ones(r, k, 1)
    ones = alpha.new_ones(r, k, n)
    return torch.baddbmm(ones, b, alpha.reshape(r, 1, n), alpha=scale).reshape(out_features, n)


def _blocked_scale(weight: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor | None, scale: float,
                   residual: bool) -> torch.Tensor:
    """Transient ``W ⊙ (1 + s A beta)`` if residual else ``s W ⊙ A ⊙ beta``, in two passes over m x n."""
    m, n = weight.shape
    r = alpha.shape[0]
    k = m // r
    b = beta.reshape(r, k, 1) if beta is not None else alpha.new_ones(r, k, 1)
    factor = torch.mul(b * scale, alpha.reshape(r, 1, n)).reshape(m, n)
    if residual:
        return torch.addcmul(weight, weight, factor, out=factor)
    return factor.mul_(weight)


def naive_adapter(x: torch.Tensor, weight: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor | None,
                  scale: float) -> torch.Tensor:
    """Adapter term of Eq. 6 through the materialized Eq. 5 weight (autograd keeps m x n tensors)."""
    return scale * F.linear(x, adapted_weight(weight, alpha, beta))


def blocked_adapter(x: torch.Tensor, weight: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor | None,
                    scale: float) -> torch.Tensor:
    """Adapter term of Eq. 6 in the row-blocked form of Eq. 7: one product per block, repeated alpha never built."""
    r = alpha.shape[0]
    k = weight.shape[0] // r
    a = alpha.to(x.dtype)
    outs = [F.linear(x * a[j], weight[j * k:(j + 1) * k]) for j in range(r)]
    y = torch.cat(outs, dim=-1)
    if beta is not None:
        y = y * beta.to(x.dtype).reshape(-1)
    return scale * y


def _row_chunks(m: int, n: int, k: int) -> list[tuple[int, int]]:
    """Row ranges made of whole blocks of ``k`` rows with at most ``BACKWARD_CHUNK_ELEMENTS`` elements."""
    rows = max(k, (BACKWARD_CHUNK_ELEMENTS // max(n, 1)) // k * k)
    return [(lo, min(lo + rows, m)) for lo in range(0, m, rows)]


class SPPFusedFunction(torch.autograd.Function):
    """Eq. 6 with hand-written gradients: three full-size products per step when dropout is off.

    ``xd`` is ``None`` when dropout is inactive; no m x n temporary survives the forward unless ``keep_weight``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, xd: torch.Tensor | None, weight: torch.Tensor, alpha: torch.Tensor,
                beta: torch.Tensor | None, bias: torch.Tensor | None, scale: float,
                residual: bool, keep_weight: bool = False) -> torch.Tensor:
        dev, cdt = x.device.type, compute_dtype(x)
        ctx.dtypes = (x.dtype, xd.dtype if xd is not None else None)
        with torch.autocast(dev, enabled=False):
            x, xd, w, a, b = (t.to(cdt) if t is not None else None for t in (x, xd, weight, alpha, beta))
            if xd is None:
                # One product with the (transient) merged weight W ⊙ (1 + s A beta), or W ⊙ A ⊙ beta.
                w_in = _blocked_scale(w, a, b, scale, residual)
                y = x @ w_in.t()
            else:
                y = x @ w.t()
                w_in = _blocked_scale(w, a, b, scale, residual=False)
                y.addmm_(xd, w_in.t())
            if bias is not None:
                y.add_(bias.to(cdt))
        ctx.scale = scale
        ctx.residual = residual
        ctx.has_xd = xd is not None
        ctx.cdt = cdt
        # keep_weight: the backward reuses this forward's W_eff / W' (one m x n tensor per layer kept alive).
        kept = w_in if keep_weight else None
        del w_in
        ctx.save_for_backward(x if xd is None else xd, weight, alpha, beta, kept)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        act, weight, alpha, beta, kept = ctx.saved_tensors
        scale, residual = ctx.scale, ctx.residual  # residual=False layers pass scale=1 (y = x (W ⊙ A ⊙ beta)^T)
        need_x, need_xd, _, need_a, need_b, need_bias = ctx.needs_input_grad[:6]
        m, n = weight.shape
        r = alpha.shape[0]
        k = m // r
        cdt = ctx.cdt
        g = g.to(cdt).contiguous()
        weight, a, b = (t.to(cdt) if t is not None else None for t in (weight, alpha, beta))
        gx = gxd = None
        if ctx.has_xd and need_x:
            gx = g @ weight  # base path: no temporary
        # The input gradient through the adapted weight (x-grad without dropout, xd-grad with it) is
        # accumulated chunk by chunk, so only a few blocks of W_eff / W' exist at any time.
        need_in = need_xd if ctx.has_xd else need_x
        fused_residual = residual and not ctx.has_xd
        need_ab = need_a or (need_b and b is not None)
        acc = None
        ga_full = torch.empty(r, n, dtype=weight.dtype, device=weight.device) if need_a else None
        gb_full = torch.empty(m, dtype=weight.dtype, device=weight.device) if need_b and b is not None else None
        gt = g.t()
        if need_in and kept is not None:
            acc = g @ kept  # the forward's W_eff / W', not rebuilt
        for lo, hi in _row_chunks(m, n, k) if ((need_in and kept is None) or need_ab) else []:
            jlo, jhi = lo // k, hi // k
            b_c = b[lo:hi] if b is not None else None
            if need_in and kept is None:
                w_c = _blocked_scale(weight[lo:hi], a[jlo:jhi], b_c, scale, fused_residual)
                acc = g[:, lo:hi] @ w_c if acc is None else acc.addmm_(g[:, lo:hi], w_c)
                del w_c
            if need_ab:
                p = gt[lo:hi] @ act  # G rows lo:hi (transient, <= BACKWARD_CHUNK_ELEMENTS)
                p.mul_(weight[lo:hi])  # P = G ⊙ W
                p3 = p.view(jhi - jlo, k, n)
                if gb_full is not None:
                    gb_full[lo:hi] = torch.bmm(p3, a[jlo:jhi].unsqueeze(-1)).reshape(-1)
                if ga_full is not None:
                    if b_c is not None:
                        ga_full[jlo:jhi] = torch.bmm(b_c.reshape(jhi - jlo, 1, k), p3).squeeze(1)
                    else:
                        ga_full[jlo:jhi] = p3.sum(dim=1)
                del p, p3
        if ctx.has_xd:
            gxd = acc.to(ctx.dtypes[1]) if acc is not None else None
        elif need_x:
            gx = acc
        if gx is not None:
            gx = gx.to(ctx.dtypes[0])
        ga = ga_full.mul_(scale).to(alpha.dtype) if ga_full is not None else None
        gb = gb_full.mul_(scale).reshape(beta.shape).to(beta.dtype) if gb_full is not None else None
        gbias = g.sum(0).to(ctx.saved_tensors[1].dtype) if need_bias else None
        return gx, gxd, None, ga, gb, gbias, None, None, None
