"""``SparsityAuditCallback``: the zero pattern of every adapted matrix must equal the pruning mask, always."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import lightning as L
import torch
from torch import nn

from spp.adapters.registry import registered_methods
from spp.distributed import DistContext
from spp.export.merged import plain_name
from spp.gathering import Gatherer, gatherer_for
from spp.pruning.zero_audit import SparsityViolation, audit_summary, check_layer_zeros

log = logging.getLogger(__name__)


def original_name(name: str) -> str:
    """Strip adapter wrappers (PEFT's ``base_model.model.`` / ``.base_layer``, SPP's ``.base``) from a path."""
    return plain_name(name).removesuffix(".base_layer").removesuffix(".base")


@torch.no_grad()
def effective_weights(model: nn.Module, names: set[str],
                      gatherer: Gatherer | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(original_name, weight the layer applies)`` for every pruned linear layer in ``names``.

    Adapted layers report :meth:`~spp.adapters.base.AdapterMethod.effective_weight` (SPP's Eq. ``W ⊙ (1 +
    s·Repeat0(alpha)⊙beta)``). Sharded weights are gathered one layer at a time (a collective: every rank must walk
    the same layers); a yielded tensor is valid until the next one is asked for.
    """
    gatherer = gatherer or gatherer_for(model)
    methods = registered_methods()
    done: set[str] = set()
    for name, module in model.named_modules():
        key = original_name(name)
        if key not in names or key in done:  # a wrapper comes before its base layer: report the wrapper only
            continue
        with gatherer.gathered(module):
            weight = next((w for w in (m.effective_weight(module, gatherer.full) for m in methods) if w is not None),
                          None)
            if weight is None and isinstance(module, nn.Linear) and not name.endswith(".base"):
                weight = gatherer.full(module.weight)
            if weight is None:
                continue
            done.add(key)
            yield key, weight


def audit(
    model: nn.Module,
    masks: Mapping[str, torch.Tensor],
    reference_zeros: Mapping[str, torch.Tensor] | None = None,
    when: str = "",
    kept_zeros_may_change: bool = False,
    gatherer: Gatherer | None = None,
) -> dict[str, Any]:
    """Check that every pruned weight is exactly zero and that the zero pattern equals ``reference_zeros``.

    ``kept_zeros_may_change`` counts, instead of raising on, kept weights whose zero-ness changed (LoRA*
    re-masking fills kept zeros); a kept weight that rounded to 0.0 is counted, never raised.

    Raises:
        SparsityViolation: naming the first layer with a revived pruned weight and how many entries.
    """
    zeros_total = total = filled = zeroed = 0
    seen = set()
    first: SparsityViolation | None = None
    for name, w in effective_weights(model, set(masks), gatherer):  # every layer: all ranks gather sharded ones
        seen.add(name)
        if first is not None:
            continue
        expected = reference_zeros[name] if reference_zeros is not None else None
        try:
            layer = check_layer_zeros(name, w, masks[name], expected, kept_zeros_may_change, when)
        except SparsityViolation as err:
            first = err
            continue
        zeros_total, total = zeros_total + layer.zeros, total + layer.numel
        filled, zeroed = filled + layer.filled, zeroed + layer.zeroed
    if first is not None:
        raise first
    missing = sorted(set(masks) - seen)
    if missing:
        raise SparsityViolation(f"[{when}] {len(missing)} pruned layer(s) not found in the model, e.g. {missing[:3]}")
    return audit_summary(len(seen), zeros_total, total, filled, zeroed)


class SparsityAuditCallback(L.Callback):
    """Audit the zero pattern at fit start, after every checkpoint and at fit end.

    Every rank walks the same layers; rank 0 compares and its verdict reaches every rank, so all stop together.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self.reports: list[dict[str, Any]] = []
        self._names: set[str] | None = None

    def _run(self, trainer: L.Trainer, pl_module: L.LightningModule, when: str) -> None:
        ctx = DistContext.current(trainer.strategy.root_device)
        masks, reference = self.source.pruned.masks, self.source.pruned.zeros
        if self._names is None:
            self._names = set(ctx.broadcast_object(sorted(masks) if ctx.is_main else None))
        model, gatherer = pl_module.model, gatherer_for(pl_module.model)  # the other ranks make rank 0's gathers
        verdict = ctx.on_main(lambda: audit(model, masks, reference, when=when, gatherer=gatherer), SparsityViolation,
                              meanwhile=lambda: deque(effective_weights(model, self._names, gatherer), maxlen=0))
        if not self.reports or self.reports[-1]["step"] != trainer.global_step or self.reports[-1]["when"] != when:
            self.reports.append({"when": when, "step": trainer.global_step, **verdict})
            if ctx.is_main and verdict["kept_weights_zeroed"]:
                log.warning("[%s] %d kept weight(s) rounded to exactly 0.0 (more zeros than the pruned model, none of "
                            "its zeros lost); counted in the audit as kept_weights_zeroed", when,
                            verdict["kept_weights_zeroed"])

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Check the adapted model against the masks before the first step."""
        self._run(trainer, pl_module, "fit_start")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """Audit whenever a checkpoint is written (once per step, however many files it writes)."""
        if self.reports and self.reports[-1]["step"] == trainer.global_step:
            return
        self._run(trainer, pl_module, f"checkpoint@step{trainer.global_step}")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Audit the trained (unmerged) model, unless a checkpoint audit already saw this very step's weights."""
        if self.reports and self.reports[-1]["step"] == trainer.global_step and trainer.global_step > 0:
            return
        self._run(trainer, pl_module, "fit_end")
