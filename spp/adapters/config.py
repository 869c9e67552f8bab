"""Structured config of the ``adapter`` group (``conf/adapter/*.yaml``): what is trained on the pruned model."""

from __future__ import annotations

import math
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path

from spp.choices import Choice
from spp.projections import DEFAULT_TARGETS

METHODS_DIR = Path(__file__).resolve().parent / "methods"
"""One module per adapter method (``spp``, ``lora``, ``none``, ...); its name is the ``adapter.name`` value."""


def method_names() -> tuple[str, ...]:
    """The registered adapter methods: the module names under ``spp/adapters/methods/`` (nothing imported)."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(METHODS_DIR)]) if not m.name.startswith("_")))


class Init(Choice):
    """Initialisation of an SPP tensor (``kaiming`` = ``nn.Linear``'s default, as the authors' alpha)."""

    kaiming = "kaiming"
    zeros = "zeros"
    ones = "ones"



class Impl(Choice):
    """Exact SPP forward implementations (``spp.adapters.spp.layer.IMPLS``)."""

    fused = "fused"
    naive = "naive"
    blocked = "blocked"
    fused_cached = "fused_cached"



class ParamDtype(Choice):
    """dtype of the trainable adapter tensors (fp32 by default whatever the base weights are, as peft's LoRA)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    float64 = "float64"



@dataclass
class AdapterConfig:
    """What is trained on top of the pruned model.

    Attributes:
        name: An adapter method (a module of ``spp/adapters/methods/``): ``spp`` (Eq. 5/6), ``lora`` (the
            LoRA* baseline: LoRA merged then re-masked), ``none`` (prune, evaluate and export without training),
            and any method added there.
        r: SPP: rows of ``alpha`` (must divide every target's out-features); LoRA: rank.
        scale: SPP scaling ``s`` of Eq. 6 (authors: lora_alpha 16 / lora_r 8 = 2.0).
        dropout: Dropout on the adapter branch input only.
        alpha_init: SPP ``alpha`` initialisation.
        beta_init: SPP ``beta`` initialisation (``zeros`` as the authors).
        use_beta: SPP with the ``beta`` column (Table 8 ablation: without it alpha must start at zero).
        impl: SPP forward implementation (all exact; ``fused`` is the fastest measured).
        residual: SPP residual form ``y = x W~^T + s dropout(x) W~'^T`` (Eq. 6).
        lora_alpha: LoRA ``alpha`` (scaling ``lora_alpha / r``).
        dtype: dtype of the trainable tensors (fp32 whatever the base dtype, so SPP and LoRA* train alike in bf16).
        targets: Module-name suffixes that receive an adapter.
    """

    name: str = "spp"
    r: int = 16
    scale: float = 2.0
    dropout: float = 0.05
    alpha_init: Init = Init.kaiming
    beta_init: Init = Init.zeros
    use_beta: bool = True
    impl: Impl = Impl.fused
    residual: bool = True
    lora_alpha: float = 16.0
    dtype: ParamDtype = ParamDtype.float32
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))

    def __post_init__(self) -> None:
        names = method_names()
        checks = [
            (self.name in names, f"adapter.name={self.name!r}: use one of {list(names)}"),
            (self.r >= 1, f"adapter.r={self.r} must be >= 1"),
            (math.isfinite(self.scale), f"adapter.scale={self.scale} must be a finite number"),
            (0.0 <= self.dropout < 1.0, f"adapter.dropout={self.dropout} must be in [0, 1)"),
            (len(self.targets) > 0, "adapter.targets is empty; list module-name suffixes such as q_proj"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
