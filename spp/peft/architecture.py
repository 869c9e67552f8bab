"""What ``spp.peft``'s tuners do to a model before adapting it, for any supported architecture.

* The default target list (``None``, or :data:`spp.projections.DEFAULT_TARGETS` in any order) becomes the model's own
  decoder-block projections (:func:`spp.projections.model_targets`): LLaMA's seven, Phi-3's fused ``qkv_proj`` /
  ``gate_up_proj``, OPT's ``out_proj``/``fc1``/``fc2``, GPT-2's ``c_attn``/``c_proj``/``c_fc``. Explicit names are
  left to peft.
* GPT-2's ``Conv1D`` layers are swapped for :class:`~spp.models.conv1d.Conv1DAsLinear` (an ``nn.Linear`` whose
  state dict keeps ``Conv1D``'s layout), in place, so the tuners see ``nn.Linear`` only and a merged model saves as a
  plain GPT-2 checkpoint.
"""

from __future__ import annotations

from peft.config import PeftConfig
from torch import nn

from spp.models.conv1d import linearize_conv1d
from spp.projections import DEFAULT_TARGETS, decoder_layers, is_default, model_targets

TARGETS_KEY = "target_modules"
"""The config key named in a bad-target error."""


def resolve_default_targets(config: PeftConfig, model: nn.Module) -> None:
    """Set ``config.target_modules`` to ``model``'s block projections when it is ``None`` or the default list.

    A module without decoder blocks (a unit test's ``Sequential``) keeps the default names, matched anywhere.
    """
    targets = config.target_modules
    if targets is not None and (isinstance(targets, str) or not is_default(targets)):
        return
    try:
        decoder_layers(model)
    except ValueError:
        config.target_modules = list(DEFAULT_TARGETS)
        return
    config.target_modules = model_targets(model, DEFAULT_TARGETS, TARGETS_KEY)


def prepare_model(model: nn.Module) -> int:
    """Hold GPT-2-style ``Conv1D`` layers as ``nn.Linear`` (in place); returns how many were swapped."""
    return linearize_conv1d(model)
