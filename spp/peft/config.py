"""``SPPConfig``: SPP's settings as a peft config (defaults are the paper's, from ``adapter=spp``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from peft.config import PeftConfig

from spp.adapters.methods.spp import io as spp_io
from spp.adapters.methods.spp.config import LAYER_KEYS
from spp.adapters.methods.spp.config import SPPAdapterConfig as _PaperDefaults
from spp.adapters.methods.spp.layer import _check_settings
from spp.peft.base_record import from_folder
from spp.peft.registration import peft_type
from spp.projections import DEFAULT_TARGETS

PEFT_FIELDS = ("peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode")
"""peft's own config keys, kept when an ``adapter_config.json`` written by spp is read."""


def from_spp_format(saved: dict[str, Any]) -> dict[str, Any]:
    """:class:`SPPConfig` keyword arguments from the ``adapter_config.json`` of
    :func:`spp.adapters.methods.spp.io.save_adapter` (``targets`` + ``layer_kwargs``; ``layers``, ``extra``,
    ``format`` and ``spp_version`` are spp's own records and are dropped)."""
    missing = [k for k in ("targets", "layer_kwargs") if k not in saved]
    if missing:
        raise ValueError(f"adapter_config.json has format 'spp' but no {missing}: the file is damaged; write it "
                         "again with spp.adapters.methods.spp.io.save_adapter")
    kwargs = {k: saved[k] for k in PEFT_FIELDS if k in saved}
    kwargs.update(saved["layer_kwargs"], target_modules=list(saved["targets"]))
    return kwargs


@dataclass
class SPPConfig(PeftConfig):
    """SPP (paper Sec. 3.2) for ``peft.get_peft_model``: each targeted ``nn.Linear`` with frozen pruned weight ``W``
    (m x n) gets ``alpha`` (r x n) and ``beta`` (m x 1); it computes Eq. 6,
    ``y = x W^T + s · dropout(x) (W ⊙ Repeat0(alpha, m/r) ⊙ beta)^T``, and merges into
    ``W ⊙ (1 + s·Repeat0(alpha)⊙beta)``, so every zero of ``W`` stays zero. The layer is spp's own ``SPPLinear``:
    the same init and forward as ``spp.inject``.

    Attributes:
        target_modules: Module-name suffixes (or one regex) of the linear layers to adapt; ``None`` or the default
            list = every linear projection of the model's decoder blocks (the paper's seven on LLaMA; Phi-3's
            fused ones, OPT's, GPT-2's ``Conv1D`` ones held as ``nn.Linear``).
        exclude_modules: Module names (or one regex) never adapted.
        r: Rows of ``alpha``; must divide every target's out-features.
        scale: ``s`` of Eq. 6.
        dropout: Dropout on the adapter branch input.
        alpha_init, beta_init: ``kaiming`` (nn.Linear's default), ``zeros`` or ``ones``.
        use_beta: With the ``beta`` column (without it, ``alpha_init`` must be ``zeros``).
        impl: ``fused``, ``fused_cached``, ``naive`` or ``blocked`` (all exact).
        residual: ``False`` is the multiplicative ablation ``y = x (W ⊙ Repeat0(alpha) ⊙ beta)^T``.
        spp_trained_on: The base the adapter folder records (:mod:`spp.peft.base_record`; ``None`` in code).
    """

    target_modules: list[str] | str | None = field(default_factory=lambda: list(DEFAULT_TARGETS))
    exclude_modules: list[str] | str | None = None
    r: int = _PaperDefaults.r
    scale: float = _PaperDefaults.scale
    dropout: float = _PaperDefaults.dropout
    alpha_init: str = str(_PaperDefaults.alpha_init)
    beta_init: str = str(_PaperDefaults.beta_init)
    use_beta: bool = _PaperDefaults.use_beta
    impl: str = str(_PaperDefaults.impl)
    residual: bool = _PaperDefaults.residual
    spp_trained_on: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = peft_type()
        self.alpha_init, self.beta_init, self.impl = str(self.alpha_init), str(self.beta_init), str(self.impl)
        if isinstance(self.target_modules, (set, tuple)):
            self.target_modules = sorted(self.target_modules)
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"SPPConfig: r={self.r!r} must be an integer >= 1 that divides every target's "
                             "out_features")
        if not math.isfinite(self.scale):
            raise ValueError(f"SPPConfig: scale={self.scale} must be a finite number")
        # SPPLinear's own checks of every setting but the shape (m = r: r divides it)
        _check_settings("SPPConfig", self.r, self.r, self.impl, self.dropout, self.alpha_init, self.beta_init,
                        self.use_beta, self.residual)

    def layer_kwargs(self) -> dict[str, Any]:
        """The :class:`~spp.adapters.methods.spp.layer.SPPLinear` keyword arguments (``spp.inject``'s)."""
        return {key: getattr(self, key) for key in LAYER_KEYS}

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, subfolder: str | None = None,
                        **kwargs: Any) -> SPPConfig:
        """peft's ``from_pretrained``, the folder's files checked and its recorded base in ``spp_trained_on``."""
        return from_folder(lambda: super(SPPConfig, cls).from_pretrained(pretrained_model_name_or_path, subfolder,
                                                                         **kwargs),
                           pretrained_model_name_or_path, subfolder)

    @classmethod
    def check_kwargs(cls, **kwargs: Any) -> dict[str, Any]:
        """Read spp's own ``adapter_config.json`` (``format: spp``, what ``train.py`` writes) as well as peft's."""
        if kwargs.get("format") == spp_io.FORMAT:
            kwargs = from_spp_format(kwargs)
        return super().check_kwargs(**kwargs)
