"""The run plan counts what each adapter method's own ``inject`` makes trainable (``spp.planning.adapter``), never a
model of the method by name: every registered method (``norms`` among them) and a plug-in defined here are planned
with the trainable count a real injection on the tiny model gives (its parameters that require grad), on one, two
and four decoder blocks (the plan builds one and two and extrapolates)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from spp.adapters.base import AdapterMethod, freeze_all
from spp.adapters.config import AdapterConfig
from spp.adapters.registry import METHODS, apply_adapter, make_config, method_names, register
from spp.models.tiny import tiny_config, tiny_model
from spp.planning.adapter import adapter_spec
from spp.planning.shapes import shape_from_arch
from spp.projections import DEFAULT_TARGETS

PLUGIN = "every_other_norm"


@dataclass
class EveryOtherNormConfig(AdapterConfig):
    """A plug-in's config (no key the planner could know)."""

    name: str = PLUGIN


class EveryOtherNorm(AdapterMethod):
    """Trains the weight of every other normalisation layer (by position in ``named_modules``) and adds one scalar:
    a count no rule keyed on a method's name could give."""

    name = PLUGIN
    config_class = EveryOtherNormConfig

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: dict[str, torch.Tensor]) -> nn.Module:
        freeze_all(model)
        norms = [m for m in model.modules() if type(m).__name__.endswith("Norm")]
        for norm in norms[::2]:
            norm.weight.requires_grad_(True)
        model.register_parameter("plugin_scale", nn.Parameter(torch.ones((), device=norms[0].weight.device)))
        return model

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: dict[str, torch.Tensor]) -> tuple[nn.Module, dict]:
        return model, {}

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        return

    def load(self, model: nn.Module, directory: Path, masks: dict[str, torch.Tensor]) -> tuple[nn.Module, Any]:
        return model, EveryOtherNormConfig()


@pytest.fixture(scope="module")
def plugin():
    """:class:`EveryOtherNorm` registered for this module's tests, then removed from the registry."""
    register(EveryOtherNorm())
    yield PLUGIN
    METHODS.entries.pop(PLUGIN, None)
    METHODS.sources.pop(PLUGIN, None)


def injected_trainable(name: str, layers: int) -> int:
    """Parameters that require grad after method ``name``'s real ``inject`` on the tiny model of ``layers`` blocks."""
    model, _names = apply_adapter(tiny_model(num_hidden_layers=layers), make_config(name), {})
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def planned_trainable(name: str, layers: int) -> int:
    """The plan's trainable count of method ``name`` on the same model (its ``meta`` skeleton, fp32)."""
    arch = {**tiny_config(num_hidden_layers=layers).to_dict(), "num_hidden_layers": layers}
    shape = shape_from_arch("tiny", arch, list(DEFAULT_TARGETS), 4)
    return adapter_spec(make_config(name), arch, shape, "float32").trainable


@pytest.mark.parametrize("layers", [1, 2, 4])
def test_every_method_and_a_plugin_are_planned_as_their_inject_trains(plugin, layers):
    names = [n for n in method_names() if n != "none"]
    assert {"norms", plugin} <= set(names)
    for name in names:
        assert planned_trainable(name, layers) == injected_trainable(name, layers), name


def test_the_plugin_count_is_its_own(plugin):
    """Negative control: the plug-in trains fewer norm weights than ``norms`` and one extra scalar, so a plan that
    borrowed another method's count (or a name-keyed formula) would differ."""
    h, layers = tiny_config().hidden_size, 2
    norms = 2 * layers + 1  # two RMSNorms per block and the final one
    assert injected_trainable(plugin, layers) == h * (-(-norms // 2)) + 1
    assert planned_trainable(plugin, layers) != planned_trainable("norms", layers)
    assert planned_trainable("norms", layers) == h * norms


def test_memory_terms_are_the_methods_own(plugin, monkeypatch):
    """What a method's layers hold beside its trained tensors comes from its hooks: the plug-in's resident buffer
    and forward copy appear in the plan, and without the hooks they do not (negative control)."""
    arch = tiny_config().to_dict()
    shape = shape_from_arch("tiny", arch, list(DEFAULT_TARGETS), 4)
    plain = adapter_spec(make_config(plugin), arch, shape, "float32")
    monkeypatch.setattr(EveryOtherNorm, "resident_terms", lambda self, n: {"plugin_bits": n // 8}, raising=False)
    monkeypatch.setattr(EveryOtherNorm, "forward_transient_values", lambda self, largest: 3 * largest, raising=False)
    hooked = adapter_spec(make_config(plugin), arch, shape, "float32")
    largest = max(o * i for o, i in hooked.dims(shape))
    assert dict(hooked.resident) == {"plugin_bits": hooked.adapted_weights(shape) // 8}
    assert hooked.forward_transient_values == 3 * largest
    assert plain.resident == () and plain.forward_transient_values == 0
    assert dict(adapter_spec(make_config("sparse_lora"), arch, shape, "float32").resident) == {
        "mask_buffers": hooked.adapted_weights(shape) // 8}
