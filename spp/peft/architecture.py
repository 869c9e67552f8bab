"""What ``spp.peft``'s tuners do to a model before adapting it, for any supported architecture.

* The default target list (``None``, or :data:`spp.projections.DEFAULT_TARGETS` in any order) becomes the model's own
  decoder-block projections (:func:`spp.projections.model_targets`): LLaMA's seven, Phi-3's fused ``qkv_proj`` /
  ``gate_up_proj``, OPT's ``out_proj``/``fc1``/``fc2``, GPT-2's ``c_attn``/``c_proj``/``c_fc``. Explicit names are
  left to peft.
* GPT-2's ``Conv1D`` layers are swapped for :class:`~spp.models.conv1d.Conv1DAsLinear` (an ``nn.Linear`` whose
  state dict keeps ``Conv1D``'s layout), in place, by the tuners' ``_prepare_model`` (``linearize_conv1d``), so they
  see ``nn.Linear`` only and a merged model saves as a plain GPT-2 checkpoint.
"""

from __future__ import annotations

from peft.config import PeftConfig
from torch import nn

from spp.projections import DEFAULT_TARGETS, is_default, names_in

TARGETS_KEY = "target_modules"
"""The config key named in a bad-target error."""


def resolve_default_targets(config: PeftConfig, model: nn.Module) -> None:
    """Set ``config.target_modules`` to ``model``'s block projections when it is ``None`` or the default list.

    A module without decoder blocks (a unit test's ``Sequential``) keeps the default names, matched anywhere.
    """
    targets = config.target_modules
    if targets is None or (not isinstance(targets, str) and is_default(targets)):
        config.target_modules = names_in(model, DEFAULT_TARGETS, TARGETS_KEY)

