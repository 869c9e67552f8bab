"""Registering spp's adapter methods (those whose ``peft_integration`` is set) with peft.

Re-registering (a second import, ``importlib.reload``) points peft at the current classes instead of failing.
"""

from __future__ import annotations

from typing import Any

from peft.mapping import (
    PEFT_TYPE_TO_CONFIG_MAPPING,
    PEFT_TYPE_TO_MIXED_MODEL_MAPPING,
    PEFT_TYPE_TO_PREFIX_MAPPING,
    PEFT_TYPE_TO_TUNER_MAPPING,
)
from peft.utils import register_peft_method

from spp.adapters.peft_base import peft_type
from spp.adapters.registry import registered_methods


def register_with_peft(config_cls: type, model_cls: type, name: str, prefix: str) -> None:
    """Register ``config_cls`` / ``model_cls`` as peft's method ``name`` (no-op if already registered).

    RuntimeError when peft already has a different method of that name.
    """
    member = peft_type(name)
    known = PEFT_TYPE_TO_TUNER_MAPPING.get(member)
    if known is model_cls and PEFT_TYPE_TO_CONFIG_MAPPING.get(member) is config_cls:
        return
    if known is not None:
        if (known.__module__, known.__qualname__) != (model_cls.__module__, model_cls.__qualname__):
            raise RuntimeError(f"peft already has a method named {name!r} ({known.__module__}.{known.__qualname__}); "
                               "spp.peft cannot register its own: use a peft version without it")
        for mapping in (PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING, PEFT_TYPE_TO_PREFIX_MAPPING,
                        PEFT_TYPE_TO_MIXED_MODEL_MAPPING):
            mapping.pop(member, None)  # the method's module re-imported: re-register its current classes
    register_peft_method(name=name, config_cls=config_cls, model_cls=model_cls, prefix=prefix)


def register_methods() -> dict[str, Any]:
    """Register every adapter method with a peft form (plug-ins included); return their exports by name."""
    exports: dict[str, Any] = {}
    for method in registered_methods():
        integration = method.peft_integration()
        if integration is None:
            continue
        register_with_peft(integration.config_class, integration.model_class, integration.name, integration.prefix)
        for obj in integration.exports:
            if exports.setdefault(obj.__name__, obj) is not obj:
                raise RuntimeError(f"adapter method {method.name!r} exports {obj.__name__!r} to spp.peft, which "
                                   "another method exports already; rename one of them")
    return exports
