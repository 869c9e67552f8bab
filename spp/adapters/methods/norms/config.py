"""``adapter=norms``'s keys: the shared ones (``targets`` names the linear layers whose biases train)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from spp.adapters.config import AdapterConfig


@dataclass
class NormsConfig(AdapterConfig):
    """PERP's retraining baseline: only the normalisation weights (RMSNorm / LayerNorm, every one of the model) and
    the biases of the ``targets`` linear layers train, in their own dtype (``dtype`` does not apply: a norm weight
    in another dtype would change the dtype of the activations it scales)."""

    method: ClassVar[str] = "norms"

    name: str = "norms"
