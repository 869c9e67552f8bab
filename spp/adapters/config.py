"""The base of every adapter method's config (``adapter.*``): the keys all methods share.

Each method subclasses it with its own keys, stored as Hydra's ``adapter/<name>_schema`` so a misspelt key is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from spp.choices import Choice
from spp.models.config import DTYPES
from spp.projections import DEFAULT_TARGETS


class ParamDtype(Choice):
    """dtype of the trainable adapter tensors (fp32 by default whatever the base weights are, as peft's LoRA)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    float64 = "float64"


@dataclass
class AdapterConfig:
    """What is trained on top of the pruned model: the keys every adapter method has.

    Attributes:
        name: The adapter method (``adapter=<name>`` picks it with its own keys): ``spp`` (Eq. 5/6), ``lora``
            (LoRA*), ``sparse_lora`` (SparsePEFT), ``masked_full``, ``scale_lora`` (PERP's ScaleLoRA), ``norms``
            (normalisation and bias parameters only), ``none`` (prune, evaluate and export without training), or a
            plug-in's (``SPP_PLUGINS``).
        targets: Module-name suffixes of the linear layers the method adapts.
        dtype: dtype of the trainable adapter tensors (fp32 whatever the base dtype, so the methods train alike in
            bf16); methods that train the model's own tensors (masked full, norms) keep those in their dtype.
    """

    method: ClassVar[str] = "none"
    """The method this class configures; a subclass states its own (``adapter.name`` must equal it)."""

    name: str = "none"
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    dtype: ParamDtype = ParamDtype.float32

    def __post_init__(self) -> None:
        if type(self).method != "none" and self.name != type(self).method:
            raise ValueError(f"adapter.name={self.name!r} but these keys are adapter={type(self).method}'s; "
                             f"choose the method with adapter={self.name} (not adapter.name=)")
        if len(self.targets) == 0:
            raise ValueError("adapter.targets is empty; list module-name suffixes such as q_proj")

    @property
    def torch_dtype(self) -> torch.dtype:
        """:attr:`dtype` as a ``torch.dtype``."""
        return DTYPES[str(self.dtype)]


def check_dropout(dropout: float) -> None:
    """``adapter.dropout`` in [0, 1) (raises ``ValueError`` naming the key)."""
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"adapter.dropout={dropout} must be in [0, 1)")


def check_rank(r: int) -> None:
    """``adapter.r`` >= 1 (raises ``ValueError`` naming the key)."""
    if r < 1:
        raise ValueError(f"adapter.r={r} must be >= 1")


def adapter_record(cfg: AdapterConfig) -> dict[str, Any]:
    """The adapter config as JSON values (enums and other objects as strings): what the adapter folder's
    ``adapter_method.json`` and the export's ``spp_export.json`` record of it."""
    return {k: v if isinstance(v, (bool, int, float, list, type(None))) else str(v) for k, v in vars(cfg).items()}
