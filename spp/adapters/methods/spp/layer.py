"""``SPPLinear``: a frozen pruned ``nn.Linear`` plus the SPP parameters alpha (r x n) and beta (m x 1)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from spp.adapters.base import LinearWrapper, freeze_all
from spp.adapters.methods.spp.config import Impl, Init, SPPAdapterConfig
from spp.adapters.methods.spp.functional import (
    SPPFusedFunction,
    adapted_weight,
    blocked_adapter,
    merge_factor,
    naive_adapter,
    repeat_alpha,
)

IMPLS: tuple[str, ...] = tuple(str(impl) for impl in Impl)
"""Exact implementations of Eq. 6: ``fused``, ``fused_cached`` (keeps W_eff), ``naive`` (Eq. 5), ``blocked`` (Eq. 7)."""

FUSED_IMPLS: tuple[str, ...] = ("fused", "fused_cached")

DEFAULT_IMPL = str(SPPAdapterConfig.impl)
"""Fastest measured on CPU (``benchmarks/layer_bench.py``, results in ``experiments/results/``)."""

INITS: tuple[str, ...] = tuple(str(init) for init in Init)


def _divisors(m: int, limit: int = 24) -> list[int]:
    """The first ``limit`` divisors of ``m`` (valid SPP ranks for an m-row weight)."""
    return [d for d in range(1, m + 1) if m % d == 0][:limit]


INIT_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "kaiming": lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5)),  # nn.Linear's default
    "zeros": nn.init.zeros_,
    "ones": nn.init.ones_,
}
"""How each :class:`~spp.adapters.methods.spp.config.Init` initialises a tensor in place."""


def _check_settings(label: str, m: int, r: int, impl: str, dropout: float, alpha_init: str, beta_init: str,
                    use_beta: bool, residual: bool) -> None:
    """Raise ``ValueError`` for SPP settings that cannot work (each message names the setting and the fix)."""
    if not isinstance(r, int) or r < 1 or m % r != 0:
        raise ValueError(
            f"{label}: r={r} does not divide out_features={m} (Repeat0 needs m/r rows per alpha row); "
            f"valid r values: {_divisors(m)}. Set adapter.r to one of them."
        )
    if impl not in IMPLS:
        raise ValueError(f"{label}: unknown impl {impl!r}; choose one of {list(IMPLS)}.")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"{label}: dropout={dropout} must be in [0, 1).")
    for key, val in (("alpha_init", alpha_init), ("beta_init", beta_init)):
        if val not in INITS:
            raise ValueError(f"{label}: {key}={val!r} is not one of {list(INITS)}.")
    if residual and use_beta and alpha_init == "zeros" and beta_init == "zeros":
        raise ValueError(
            f"{label}: alpha_init and beta_init are both 'zeros': the adapter gradients vanish and the "
            "parameters stay zero (paper appendix, Table 8). Set alpha_init='kaiming' (default)."
        )
    if residual and not use_beta and alpha_init != "zeros":
        raise ValueError(
            f"{label}: use_beta=False needs alpha_init='zeros' (got {alpha_init!r}); otherwise the model "
            "does not start as the pruned model. Set alpha_init='zeros'."
        )


class SPPLinear(LinearWrapper):
    """Sparsity-preserved adapter around a frozen pruned linear layer (paper Sec. 3.2, Eq. 5-6).

    Merge writes ``W ⊙ (1 + s A beta)``, so every zero stays; ``residual=False`` is the Sec. 3.2 ablation
    ``y = x (W ⊙ A ⊙ beta)^T``. Parameters stay fp32 on bf16/fp16 bases (as peft keeps LoRA factors).
    """

    def __init__(
        self,
        base: nn.Linear,
        r: int = SPPAdapterConfig.r,
        scale: float = SPPAdapterConfig.scale,
        dropout: float = SPPAdapterConfig.dropout,
        alpha_init: str = str(SPPAdapterConfig.alpha_init),
        beta_init: str = str(SPPAdapterConfig.beta_init),
        use_beta: bool = SPPAdapterConfig.use_beta,
        impl: str = DEFAULT_IMPL,
        name: str | None = None,
        residual: bool = SPPAdapterConfig.residual,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        label = name or "SPPLinear"
        if not isinstance(base, nn.Linear):
            raise TypeError(f"{label}: SPPLinear wraps an nn.Linear, got {type(base).__name__}.")
        m, n = base.out_features, base.in_features
        _check_settings(label, m, r, impl, dropout, alpha_init, beta_init, use_beta, residual)
        if not residual:
            alpha_init = beta_init = "ones"
        self.base = base
        self.r = r
        self.scale = float(scale) if residual else 1.0
        self.dropout_p = float(dropout) if residual else 0.0
        self.impl = impl
        self.name = name
        self.use_beta = use_beta
        self.residual = residual
        self.alpha_init, self.beta_init = alpha_init, beta_init
        self.merged = False
        self._original_weight: torch.Tensor | None = None
        freeze_all(base)
        w = base.weight
        pdt = dtype or torch.promote_types(w.dtype, torch.float32)
        self.spp_alpha = nn.Parameter(torch.empty(r, n, dtype=pdt, device=w.device))
        INIT_FUNCTIONS[alpha_init](self.spp_alpha.data)
        if use_beta:
            self.spp_beta = nn.Parameter(torch.empty(m, 1, dtype=pdt, device=w.device))
            INIT_FUNCTIONS[beta_init](self.spp_beta.data)
        else:
            self.register_parameter("spp_beta", None)

    def extra_repr(self) -> str:
        return (f"r={self.r}, scale={self.scale}, dropout={self.dropout_p}, impl={self.impl!r}, "
                f"use_beta={self.use_beta}, residual={self.residual}, merged={self.merged}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 6 (or the merged layer's plain linear once ``merge()`` has run)."""
        if self.merged:
            return self.base(x)
        w, bias = self.base.weight, self.base.bias
        alpha, beta = self.spp_alpha, self.spp_beta
        drop = self.residual and self.training and self.dropout_p > 0
        if self.impl in FUSED_IMPLS:
            m, n = self.out_features, self.in_features
            xd = F.dropout(x, self.dropout_p, True).reshape(-1, n) if drop else None
            y = SPPFusedFunction.apply(x.reshape(-1, n), xd, w, alpha, beta, bias, self.scale, self.residual,
                                       self.impl == "fused_cached")
            return y.reshape(*x.shape[:-1], m)
        if not self.residual:
            return F.linear(x, adapted_weight(w, alpha, beta), bias)
        xd = F.dropout(x, self.dropout_p, True) if drop else x
        adapter = naive_adapter if self.impl == "naive" else blocked_adapter
        return self.base(x) + adapter(xd, w, alpha, beta, self.scale)

    def _factor(self) -> torch.Tensor:
        """fp32 multiplier of the merged weight: ``1 + s A beta`` (residual) or ``A beta`` (no residual)."""
        alpha = self.spp_alpha.detach().float()
        beta = self.spp_beta.detach().float() if self.spp_beta is not None else None
        if self.residual:
            return merge_factor(alpha, beta, self.out_features, self.scale)
        f = repeat_alpha(alpha, self.out_features)
        return f * beta if beta is not None else f

    @torch.no_grad()
    def merge(self, keep_original: bool = True) -> None:
        """Write the adapted weight into ``base.weight`` (fp32 product rounded once; zeros keep their bits).

        Without ``keep_original``, ``unmerge()`` divides by the factor (one rounding) instead of restoring a copy.
        """
        if self.merged:
            raise RuntimeError(f"{self.name or 'SPPLinear'}: merge() called on an already merged layer.")
        w = self.base.weight
        self._original_weight = w.detach().clone() if keep_original else None
        merged = (w.float() * self._factor()).to(w.dtype)
        merged = torch.where(w == 0, w, merged)
        lost = int((merged == 0).sum() - (w == 0).sum())
        if lost:
            warnings.warn(f"{self.name or 'SPPLinear'}: merge turned {lost} non-zero weights into zeros "
                          "(factor 0 or underflow in the weight dtype).", stacklevel=2)
        w.copy_(merged)
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Undo ``merge()``: bit-exact from the kept copy, otherwise by dividing by the fp32 factor."""
        if not self.merged:
            raise RuntimeError(f"{self.name or 'SPPLinear'}: unmerge() called on a layer that is not merged.")
        w = self.base.weight
        if self._original_weight is not None:
            w.copy_(self._original_weight)
            self._original_weight = None
        else:
            factor = self._factor()
            if bool(((factor == 0) & (w == 0)).any()):
                raise ValueError(f"{self.name or 'SPPLinear'}: the merge factor is 0 for some weights, so they "
                                 "cannot be recovered by division; merge with keep_original=True.")
            w.copy_(torch.where(w == 0, w, (w.float() / factor).to(w.dtype)))
        self.merged = False
