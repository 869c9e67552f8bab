"""spp's peft methods: ``PeftType.SPP`` / ``SPARSE_LORA`` / ``LORA_STAR`` and peft's registry entries (idempotent).

peft's :func:`peft.utils.register_peft_method` accepts only names that :class:`peft.PeftType` lists, and that enum
has no way to add a member from outside peft; :func:`peft_type` adds ``SPP`` (or ``SPARSE_LORA``) to it (the same
member object peft's own members are: a ``str`` equal to its name, so ``"SPP"`` read from ``adapter_config.json``
finds it in peft's mappings). :func:`register_with_peft` then calls ``register_peft_method`` once per process;
calling it again (a second import, ``importlib.reload``) points peft at the current classes instead of failing on
the duplicate name.
"""

from __future__ import annotations

from peft.utils import PeftType, register_peft_method

NAME = "spp"
"""The method's name for peft (``PeftType.SPP``, ``adapter_config.json``'s ``"peft_type": "SPP"``)."""

PREFIX = "spp_"
"""peft's prefix of the method's tensors (``spp_alpha``, ``spp_beta``), as in spp's own adapter files."""

SPARSE_LORA_NAME = "sparse_lora"
"""SparsePEFT's name for peft (``PeftType.SPARSE_LORA``, ``"peft_type": "SPARSE_LORA"``)."""

SPARSE_LORA_PREFIX = "lora_"
"""SparsePEFT's tensors are LoRA's (``lora_A``, ``lora_B``): the same prefix and state-dict keys."""

LORA_STAR_NAME = "lora_star"
"""LoRA*'s name for peft (``PeftType.LORA_STAR``, ``"peft_type": "LORA_STAR"``); tensors are LoRA's (``lora_``)."""


def peft_type(name: str = NAME) -> PeftType:
    """``PeftType.SPP`` (or ``PeftType.<NAME>`` for ``name``), added to peft's enum on first use (a member like
    ``PeftType.LORA``: ``str`` value = name)."""
    key = name.upper()
    if key in PeftType.__members__:
        return PeftType[key]
    member = str.__new__(PeftType, key)
    member._name_ = member._value_ = key
    member._sort_order_ = len(PeftType._member_names_)
    member.__objclass__ = PeftType
    PeftType._member_map_[key] = member
    PeftType._value2member_map_[key] = member
    PeftType._member_names_.append(key)
    type.__setattr__(PeftType, key, member)  # EnumType.__setattr__ refuses to (re)bind member names
    return member


def register_with_peft(config_cls: type, model_cls: type, name: str = NAME, prefix: str = PREFIX) -> None:
    """Register ``config_cls`` / ``model_cls`` as peft's method ``name`` (``get_peft_model``,
    ``PeftModel.from_pretrained``); a no-op when they are registered already.

    Raises:
        RuntimeError: peft already has a different method named ``name`` (not one of these classes' modules).
    """
    from peft.mapping import (
        PEFT_TYPE_TO_CONFIG_MAPPING,
        PEFT_TYPE_TO_MIXED_MODEL_MAPPING,
        PEFT_TYPE_TO_PREFIX_MAPPING,
        PEFT_TYPE_TO_TUNER_MAPPING,
    )

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
            mapping.pop(member, None)  # this module re-imported: re-register its current classes
    register_peft_method(name=name, config_cls=config_cls, model_cls=model_cls, prefix=prefix)
