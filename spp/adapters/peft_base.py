"""What spp's peft methods share (each method's tuner lives in its own folder, ``methods/<name>/peft_tuner.py``;
``spp.peft`` registers them with peft).

* :func:`peft_type`: the method's member of peft's :class:`peft.PeftType`, added on first use (peft's
  ``register_peft_method`` accepts only names that enum lists, and it has no way to add a member from outside).
* :func:`resolve_default_targets`: the default target list (``None``, or :data:`spp.projections.DEFAULT_TARGETS` in
  any order) becomes the model's own decoder-block projections (:func:`spp.projections.model_targets`: LLaMA's
  seven, Phi-3's fused ``qkv_proj`` / ``gate_up_proj``, OPT's, GPT-2's); explicit names are left to peft.
* The base an adapter folder records (:mod:`spp.adapters.trained_on`), carried by a config read from a folder
  (:func:`from_folder`, field ``spp_trained_on``: ``{}`` when the folder records none, ``None`` for a config made in
  code) and checked by the tuners on the plain base model before they replace any layer
  (:func:`check_recorded_base`).
* The mixins of the tuners built on peft's ``LoraConfig`` / ``LoraModel`` (SparsePEFT, LoRA*); GPT-2's ``Conv1D``
  layers are held as ``nn.Linear`` first (:func:`spp.models.conv1d.linearize_conv1d`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from peft import LoraConfig
from peft.config import PeftConfig
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import PeftType
from torch import nn

from spp.adapters.base import CONFIG_NAME, read_json_file
from spp.adapters.registry import check_adapter_files, trained_on
from spp.adapters.trained_on import check_base
from spp.models.conv1d import linearize_conv1d
from spp.projections import DEFAULT_TARGETS, is_default, names_in

C = TypeVar("C", bound=PeftConfig)

SOURCE_ATTR = "_spp_source"
"""Where a config was read from (not a dataclass field: never saved), for the refusal's wording."""

UNSUPPORTED = ("use_dora", "fan_in_fan_out", "lora_bias")
"""``LoraConfig`` options spp's LoRA-shaped methods have no masked form of."""


def peft_type(name: str) -> PeftType:
    """``PeftType.<NAME>`` for method ``name``, added to peft's enum on first use (a member like ``PeftType.LORA``:
    a ``str`` equal to its name, so ``"SPP"`` read from ``adapter_config.json`` finds it in peft's mappings)."""
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


def read_lora_settings(directory: str | os.PathLike, own_type: str, label: str,
                       expected: str) -> tuple[LoraConfig, bool]:
    """The LoRA settings of a LoRA-shaped method's folder (``adapter_config.json``'s ``peft_type`` ``own_type``, or
    ``LORA`` in folders written before), as a plain ``LoraConfig`` read without peft's registry, and whether it
    says ``own_type``. ``label`` (the method) and ``expected`` (the folder wanted) word the errors.

    Raises:
        FileNotFoundError: no ``adapter_config.json``. ValueError: another ``peft_type``, or a damaged file.
    """
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"No {CONFIG_NAME} in {directory}; expected {expected}")
    saved = read_json_file(path)
    kind = saved.get("peft_type")
    if kind not in ("LORA", own_type):
        raise ValueError(f"{path} is not a {label} adapter (peft_type={kind!r})")
    return LoraConfig.from_peft_type(**{**saved, "peft_type": "LORA"}), kind == own_type


def resolve_default_targets(config: PeftConfig, model: nn.Module) -> None:
    """Set ``config.target_modules`` to ``model``'s block projections when it is ``None`` or the default list (a
    module without decoder blocks, such as a unit test's ``Sequential``, keeps the default names, matched anywhere)."""
    targets = config.target_modules
    if targets is None or (not isinstance(targets, str) and is_default(targets)):
        config.target_modules = names_in(model, DEFAULT_TARGETS, "target_modules")


def from_folder(load: Callable[[], C], path: str | os.PathLike, subfolder: str | None = None) -> C:
    """``load()`` (peft's ``from_pretrained``) after checking a local folder's files (a truncated JSON or
    safetensors file is one line naming it), with the folder's record in ``spp_trained_on``."""
    local = Path(path, subfolder or "").expanduser()
    if local.is_dir():
        check_adapter_files(local, key="adapter folder")
    config = load()
    if local.is_dir():
        if getattr(config, "spp_trained_on", None) is None:
            config.spp_trained_on = trained_on(local) or {}
        setattr(config, SOURCE_ATTR, str(local))
    return config


def check_recorded_base(config: PeftConfig, model: nn.Module) -> None:
    """Refuse ``model`` when it is not the base ``config``'s folder records (warn when the folder records none);
    nothing for a config made in code."""
    record: dict[str, Any] | None = getattr(config, "spp_trained_on", None)
    if record is None:
        return
    source = getattr(config, SOURCE_ATTR, None)
    what = f"the adapter folder {source!r}" if source else "this adapter"
    check_base(record or None, model, what, key="adapter folder", path=source)


class MaskedLoraConfigMixin:
    """What spp's peft configs built on ``LoraConfig`` (SparsePEFT, LoRA*) share: their own peft type, the LoRA
    options they refuse, the folder check of ``from_pretrained`` and the older ``"peft_type": "LORA"`` they read.
    Listed before ``LoraConfig`` among the bases; the class sets ``spp_name`` (its peft name) and ``masks`` (what
    the refusal says it masks)."""

    spp_name: ClassVar[str]
    masks: ClassVar[str]

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        self.peft_type = peft_type(self.spp_name)
        bad = [key for key in UNSUPPORTED if getattr(self, key)]
        if bad:
            raise ValueError(f"{type(self).__name__}: {bad[0]}={getattr(self, bad[0])!r} is not supported ("
                             f"{self.masks}); leave it at its default")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, subfolder: str | None = None, **kwargs: Any) -> Any:
        """peft's ``from_pretrained``, the folder's files checked and its recorded base in ``spp_trained_on``."""
        parent = super()
        return from_folder(lambda: parent.from_pretrained(pretrained_model_name_or_path, subfolder, **kwargs),
                           pretrained_model_name_or_path, subfolder)

    @classmethod
    def check_kwargs(cls, **kwargs: Any) -> dict[str, Any]:
        """Also reads a folder spp wrote before it recorded its own peft type (``"peft_type": "LORA"`` there)."""
        if kwargs.get("peft_type") == "LORA":
            kwargs["peft_type"] = str(peft_type(cls.spp_name).value)
        return super().check_kwargs(**kwargs)  # type: ignore[misc]


class MaskedLoraModelMixin:
    """What spp's tuners built on ``LoraModel`` share: default targets (the model's block projections), GPT-2's
    ``Conv1D`` held as ``nn.Linear``, a folder's adapter refused on another base than the one it records
    (:func:`check_recorded_base`), and ``nn.Linear`` targets only, each replaced by the class's ``layer_class``.
    Listed before ``LoraModel`` among the bases; the class sets ``layer_class`` and ``label`` (its name in refusals)."""

    layer_class: ClassVar[type[nn.Module]]
    label: ClassVar[str]

    def _prepare_adapter_config(self, peft_config: Any, model_config: dict) -> Any:
        resolve_default_targets(peft_config, self.model)  # type: ignore[attr-defined]
        return super()._prepare_adapter_config(peft_config, model_config)  # type: ignore[misc]

    def _prepare_model(self, peft_config: PeftConfig, model: nn.Module) -> None:
        linearize_conv1d(model)  # GPT-2's Conv1D held as nn.Linear, in place (its state dict keeps Conv1D's layout)
        check_recorded_base(peft_config, model)
        super()._prepare_model(peft_config, model)  # type: ignore[misc]

    @classmethod
    def _create_new_module(cls, lora_config: Any, adapter_name: str, target: nn.Module, **kwargs: Any) -> nn.Module:
        """A ``layer_class`` layer (mask ``W~ ≠ 0`` of the base layer) for an ``nn.Linear`` target."""
        base = target.get_base_layer() if isinstance(target, BaseTunerLayer) else target
        if not isinstance(base, nn.Linear) or kwargs.get("parameter_name") is not None:
            raise ValueError(f"{cls.label} adapts nn.Linear layers only, but target {kwargs.get('target_name')} is a "
                             f"{type(base).__name__}; leave it out of the config's target_modules")
        return cls.layer_class(target, adapter_name, config=lora_config, **kwargs)
