"""``adapter=masked_full``'s keys: the shared ones only (it trains the adapted weights themselves)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from spp.adapters.config import AdapterConfig


@dataclass
class MaskedFullConfig(AdapterConfig):
    """Masked full fine-tuning: every kept weight of the ``targets`` projections trains (gradient ``dL/dW ⊙ M``), in
    the weights' own dtype (``dtype`` does not apply)."""

    method: ClassVar[str] = "masked_full"

    name: str = "masked_full"
