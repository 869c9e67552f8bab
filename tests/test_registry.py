"""``spp.registry.Registry``, the one shape of the pruner, adapter-method, objective and eval-task registries: the
name comes from the config's ``name`` default and must match it, a second entry under a name is refused in one line
naming both files, a re-registration of the same entry is a no-op, an unknown name is one line listing the known."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from spp.adapters.registry import METHODS
from spp.errors import UserError
from spp.eval.task_table import REGISTRY as TASKS
from spp.pruning.registry import PRUNERS
from spp.registry import Registry
from spp.training.objectives.base import OBJECTIVES


@dataclass
class NamedConfig:
    name: str = "alpha"


@dataclass
class UnnamedConfig:
    size: int = 1


class Entry:
    """An entry defined in this file."""


def test_the_name_comes_from_the_config_default_and_must_match_it():
    reg: Registry[type] = Registry("thing", "thing.name")
    assert reg.register(None, Entry, NamedConfig) == "alpha" and reg.get("alpha") is Entry
    with pytest.raises(UserError) as err:
        reg.register("beta", Entry, NamedConfig)
    assert "thing 'beta': its config NamedConfig.name defaults to 'alpha', not 'beta'" in str(err.value)
    assert __file__ in str(err.value) and "\n" not in str(err.value)
    assert reg.register("gamma", Entry, UnnamedConfig) == "gamma"  # no name field: the given name
    with pytest.raises(UserError, match="has no name"):
        reg.register(None, Entry, UnnamedConfig)


def test_a_duplicate_names_both_files_and_the_same_entry_again_is_a_no_op():
    reg: Registry[object] = Registry("thing", "thing.name")
    first = Entry()
    reg.register("alpha", first)
    assert reg.register("alpha", Entry()) == "alpha" and reg.get("alpha") is first  # same class, same file
    with pytest.raises(UserError) as err:
        reg.register("alpha", NamedConfig(), source="/elsewhere/plugin/__init__.py")
    text = str(err.value)
    assert text.startswith("thing 'alpha' is registered twice: by ") and "\n" not in text
    assert __file__ in text and "/elsewhere/plugin/__init__.py" in text


def test_an_unknown_name_is_one_line_listing_the_known_ones():
    reg: Registry[type] = Registry("thing", "thing.name")
    reg.register("b", Entry)
    reg.register("a", NamedConfig)
    with pytest.raises(UserError) as err:
        reg.get("c")
    assert "thing.name='c' is not a registered thing" in str(err.value) and "['a', 'b']" in str(err.value)
    assert err.value.key == "thing.name" and reg.names() == ["a", "b"]


def test_the_project_registries_share_the_shape():
    from spp.adapters.registry import method_names

    method_names()  # the built-in methods, imported on first use
    for reg, name in ((PRUNERS, "wanda"), (METHODS, "spp"), (OBJECTIVES, "ce"), (TASKS, "spp_boolq")):
        assert isinstance(reg, Registry) and name in reg.names()
        with pytest.raises(UserError):
            reg.get("no_such_name")


def _plugin_method(method_name: str) -> type:
    """A plug-in adapter method (defined in this file) that changes nothing: only the registration checks act on it."""
    from spp.adapters.base import AdapterMethod
    from spp.adapters.config import AdapterConfig

    @dataclass
    class PluginConfig(AdapterConfig):
        name: str = method_name

    class Plugin(AdapterMethod):
        name = method_name
        config_class = PluginConfig

        def inject(self, model, cfg, masks):
            return model

        def merge(self, model, cfg, masks):
            return model, {}

        def save(self, model, directory, extra):
            pass

        def load(self, model, directory, masks):
            return model, PluginConfig()

    return Plugin


def test_an_adapter_method_that_audits_layers_it_cannot_merge_is_refused_when_it_registers():
    """``effective_weight`` without ``merged_layer``: the sparsity audit passes and the export fails only after
    training, so ``register`` refuses it in one line; with ``merged_layer`` it registers (control)."""
    from torch import nn

    from spp.adapters.base import MergedLayer
    from spp.adapters.registry import register

    class Half(_plugin_method("half_adapter")):
        def effective_weight(self, module, full):
            return full(module.weight) if isinstance(module, nn.Linear) else None

    with pytest.raises(UserError, match=r"adapter method Half \(.*test_registry.py\) says what its adapted layers "
                                        r"apply \(effective_weight\) but not how they merge.*define Half.merged_layer"):
        register(Half())
    assert "half_adapter" not in METHODS.names()

    class Whole(Half):
        def merged_layer(self, module, mask):
            return MergedLayer({"weight": module.weight}) if isinstance(module, nn.Linear) else None

    try:
        register(Whole())
        assert "half_adapter" in METHODS.names()
    finally:
        METHODS.entries.pop("half_adapter", None), METHODS.sources.pop("half_adapter", None)


def test_a_plug_in_that_merges_layers_it_does_not_say_the_weight_of_is_refused_when_it_registers():
    """``merged_layer`` without ``effective_weight`` in a plug-in: its wrapped layers are invisible to the sparsity
    audit, which fails at fit start with "pruned layer(s) not found"; ``register`` refuses it in one line naming the
    file and the method to write. With ``effective_weight`` it registers and the audit finds the layer (control); the
    built-in LoRA* (peft's ``base_layer``, audited as is) stays registered."""
    import torch
    from torch import nn

    from spp.adapters.base import MergedLayer
    from spp.adapters.registry import register
    from spp.training.callbacks.sparsity_audit import audit

    class Wrapped(nn.Module):
        def __init__(self, base: nn.Linear) -> None:
            super().__init__()
            self.base = base

    class Wrap(_plugin_method("wrap_adapter")):
        def merged_layer(self, module, mask):
            return MergedLayer({"weight": module.base.weight}) if isinstance(module, Wrapped) else None

    with pytest.raises(UserError, match=r"^adapter method Wrap \(.*test_registry.py\) says how its adapted layers "
                                        r"merge \(merged_layer\) but not what they apply.* Wrap.effective_weight"):
        register(Wrap())
    assert "wrap_adapter" not in METHODS.names() and "lora" in METHODS.names()
    model = nn.Sequential(Wrapped(nn.Linear(4, 4)))
    masks = {"0": torch.ones(4, 4, dtype=torch.bool)}
    with pytest.raises(Exception, match=r"pruned layer\(s\) not found"):  # what it would meet at fit start
        audit(model, masks)

    class Seen(Wrap):
        def effective_weight(self, module, full):
            return full(module.base.weight) if isinstance(module, Wrapped) else None

    try:
        register(Seen())
        assert "wrap_adapter" in METHODS.names() and audit(model, masks)["layers"] == 1
    finally:
        METHODS.entries.pop("wrap_adapter", None), METHODS.sources.pop("wrap_adapter", None)
