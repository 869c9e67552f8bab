"""Registering spp's adapter methods with peft: each method that has a peft form says so
(:meth:`spp.adapters.base.AdapterMethod.peft_integration`) and :func:`register_methods` registers it.

peft's :func:`peft.utils.register_peft_method` accepts only names that :class:`peft.PeftType` lists; the method's
config adds its member (:func:`spp.adapters.peft_base.peft_type`). :func:`register_with_peft` then calls
``register_peft_method`` once per process; calling it again (a second import, ``importlib.reload``) points peft at
the current classes instead of failing on the duplicate name.
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
    """Register ``config_cls`` / ``model_cls`` as peft's method ``name`` (``get_peft_model``,
    ``PeftModel.from_pretrained``), its tensors named ``<prefix>...``; a no-op when they are registered already.

    Raises:
        RuntimeError: peft already has a different method named ``name`` (not one of these classes' modules).
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
    """Register every adapter method that has a peft form (plug-ins included) and return what they export, by name.

    Raises:
        RuntimeError: two methods export the same name, or peft has another method of a method's name.
    """
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
