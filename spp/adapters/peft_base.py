"""What spp's peft methods share: their ``PeftType`` members, the config and tuner mixins (default targets, the
recorded-base check; SPP, SparsePEFT, LoRA*) and those of the tuners built on ``LoraConfig`` / ``LoraModel``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from peft import LoraConfig
from peft.config import PeftConfig
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import PeftType
from torch import nn

from spp.adapters.base import CONFIG_NAME, WEIGHTS_NAME, linear_tensors, read_json_file, write_json_file
from spp.adapters.registry import check_adapter_files, trained_on
from spp.adapters.trained_on import check_base
from spp.bitmask import pack_rows, unpack_rows
from spp.models.conv1d import linearize_conv1d
from spp.projections import DEFAULT_TARGETS, is_default, model_targets, names_in

C = TypeVar("C", bound=PeftConfig)

SOURCE_ATTR = "_spp_source"
"""Where a config was read from (not a dataclass field: never saved), for the refusal's wording."""

FILE_DTYPE_ATTR = "_spp_file_dtype_adapters"
"""A tuner's adapters loaded in their file's dtype (peft's load then leaves them so, not upcast to fp32)."""

UNSUPPORTED = ("use_dora", "fan_in_fan_out", "lora_bias")
"""``LoraConfig`` options spp's LoRA-shaped methods have no masked form of."""


def peft_type(name: str) -> PeftType:
    """``PeftType.<NAME>`` for method ``name``, added to peft's enum on first use.

    peft's ``register_peft_method`` accepts only names the enum lists and offers no way to add a member.
    """
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
    """A LoRA-shaped folder's settings as a plain ``LoraConfig`` (no peft registry); whether it says ``own_type``.

    Older folders say ``LORA``; ``label`` and ``expected`` word the errors.
    """
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"No {CONFIG_NAME} in {directory}; expected {expected}")
    saved = read_json_file(path)
    kind = saved.get("peft_type")
    if kind not in ("LORA", own_type):
        raise ValueError(f"{path} is not a {label} adapter (peft_type={kind!r})")
    return LoraConfig.from_peft_type(**{**saved, "peft_type": "LORA"}), kind == own_type


def lora_config(model: nn.Module, targets: Sequence[str], r: int, alpha: float, dropout: float,
                task_type: str | None = "CAUSAL_LM") -> LoraConfig:
    """peft's ``LoraConfig`` (no bias) of the projections ``targets`` names in ``model`` (spp's LoRA-shaped methods)."""
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none", task_type=task_type,
                      target_modules=model_targets(model, targets, "adapter.targets"))


def lora_keys(config: LoraConfig) -> dict[str, Any]:
    """The ``adapter.*`` keys (``targets``, ``r``, ``lora_alpha``, ``dropout``) a saved ``LoraConfig`` records."""
    return {"targets": sorted(config.target_modules), "r": config.r, "lora_alpha": float(config.lora_alpha),
            "dropout": float(config.lora_dropout)}


@torch.no_grad()
def merged_copy(layer: BaseTunerLayer) -> dict[str, torch.Tensor]:
    """The plain tensors of a peft layer merged by its own ``merge`` on a copy (the layer itself is left as it is)."""
    merged = copy.deepcopy(layer)
    merged.merge()
    return linear_tensors(merged.get_base_layer())


def save_as_peft_type(model: nn.Module, directory: Path, own_type: str) -> None:
    """peft's ``save_pretrained`` files, ``adapter_config.json`` saying ``own_type`` (peft alone refuses the folder)."""
    model.save_pretrained(directory)
    path = Path(directory) / CONFIG_NAME
    write_json_file(path, {**read_json_file(path), "peft_type": own_type})


def read_peft_folder(path: Path, directory: str | os.PathLike, what: str) -> dict[str, Any]:
    """A peft adapter folder's ``adapter_config.json``, after checking it and the tensors are there (``what`` it is)."""
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (path / name).is_file():
            raise FileNotFoundError(f"No {name} in {str(directory)!r}; point at {what}")
    return read_json_file(path / CONFIG_NAME, key="adapter folder")


def from_folder(load: Callable[[], C], path: str | os.PathLike, subfolder: str | None = None) -> C:
    """``load()`` (peft's ``from_pretrained``) after checking a local folder; its record in ``spp_trained_on``."""
    local = Path(path, subfolder or "").expanduser()
    if local.is_dir():
        check_adapter_files(local, key="adapter folder")
    config = load()
    if local.is_dir():
        if getattr(config, "spp_trained_on", None) is None:
            config.spp_trained_on = trained_on(local) or {}
        setattr(config, SOURCE_ATTR, str(local))
    return config


class RecordedConfigMixin:
    """Shared by spp's peft configs (listed first among the bases; sets ``spp_name``): the ``PeftType`` member, and
    ``from_pretrained`` that checks the folder's files and keeps its recorded base in ``spp_trained_on``."""

    spp_name: ClassVar[str]

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        self.peft_type = peft_type(self.spp_name)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, subfolder: str | None = None, **kwargs: Any) -> Any:
        """peft's ``from_pretrained``, the folder's files checked and its recorded base in ``spp_trained_on``."""
        parent = super()
        return from_folder(lambda: parent.from_pretrained(pretrained_model_name_or_path, subfolder, **kwargs),
                           pretrained_model_name_or_path, subfolder)


class RecordedBaseTunerMixin:
    """Shared by spp's peft tuners (listed first among the bases): default targets resolved on the model, GPT-2's
    ``Conv1D`` held as ``nn.Linear``, and a folder's adapter refused on another base than it records."""

    def _prepare_adapter_config(self, peft_config: Any, model_config: dict) -> Any:
        """``target_modules`` ``None`` or the default list -> the model's block projections (``self.model`` is set by
        ``BaseTuner.__init__`` before this runs)."""
        targets = peft_config.target_modules
        if targets is None or (not isinstance(targets, str) and is_default(targets)):
            peft_config.target_modules = names_in(self.model, DEFAULT_TARGETS, "target_modules")  # type: ignore[attr-defined]
        return super()._prepare_adapter_config(peft_config, model_config)  # type: ignore[misc]

    def _prepare_model(self, peft_config: PeftConfig, model: nn.Module) -> None:
        linearize_conv1d(model)  # in place; the state dict keeps Conv1D's layout
        record: dict[str, Any] | None = getattr(peft_config, "spp_trained_on", None)
        if record is not None:  # read from a folder: refuse another base (warn without a record)
            source = getattr(peft_config, SOURCE_ATTR, None)
            what = f"the adapter folder {source!r}" if source else "this adapter"
            check_base(record or None, model, what, key="adapter folder", path=source)
        super()._prepare_model(peft_config, model)  # type: ignore[misc]

    @classmethod
    def _remap_adapter_state_dict_for_load(cls, model: nn.Module, config: PeftConfig, adapter_name: str,
                                           state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """peft's mapping; each adapter tensor then takes the file's dtype (``adapter.dtype``; peft would copy it into
        fp32), so ``merge_and_unload()`` computes the run's own export."""
        remapped = super()._remap_adapter_state_dict_for_load(model, config, adapter_name, state_dict)  # type: ignore[misc]
        params = dict(model.named_parameters())
        for key, tensor in remapped.items():
            param = params.get(key, params.get(key.removeprefix("base_model.model.")))
            if param is not None and tensor.is_floating_point() and param.dtype != tensor.dtype:
                param.data = param.data.to(tensor.dtype)
                getattr(model, "base_model", model).__dict__.setdefault(FILE_DTYPE_ATTR, set()).add(adapter_name)
        return remapped

    def _cast_adapter_dtype(self, adapter_name: str, autocast_adapter_dtype: bool = True) -> None:
        """peft's upcast of bf16/fp16 adapters to fp32, except for one loaded from a file (kept in its dtype)."""
        from_file = adapter_name in self.__dict__.get(FILE_DTYPE_ATTR, ())
        super()._cast_adapter_dtype(adapter_name, autocast_adapter_dtype and not from_file)  # type: ignore[misc]


class MaskedLoraConfigMixin(RecordedConfigMixin):
    """Shared by peft configs built on ``LoraConfig`` (listed first among the bases; sets ``spp_name``, ``masks``)."""

    masks: ClassVar[str]

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = [key for key in UNSUPPORTED if getattr(self, key)]
        if bad:
            raise ValueError(f"{type(self).__name__}: {bad[0]}={getattr(self, bad[0])!r} is not supported ("
                             f"{self.masks}); leave it at its default")

    @classmethod
    def check_kwargs(cls, **kwargs: Any) -> dict[str, Any]:
        """Also reads a folder spp wrote before it recorded its own peft type (``"peft_type": "LORA"`` there)."""
        if kwargs.get("peft_type") == "LORA":
            kwargs["peft_type"] = str(peft_type(cls.spp_name).value)
        return super().check_kwargs(**kwargs)  # type: ignore[misc]


class MaskedLoraLinear(LoraLinear):
    """peft ``lora.Linear`` with a bit-packed mask buffer ``mask_packed`` (``M = W~ ≠ 0`` at creation) whose delta is
    ``s·(B A) ⊙ M`` (what merge and unmerge add): the layer of SparsePEFT and LoRA*, kept as two classes."""

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: LoraConfig, **kwargs: Any) -> None:
        super().__init__(base_layer, adapter_name, config=config, **kwargs)
        weight = self.get_base_layer().weight
        self.register_buffer("mask_packed", pack_rows(weight.detach() != 0), persistent=False)

    @property
    def mask(self) -> torch.Tensor:
        """The mask in use (bool, out x in, True = trained/kept), unpacked (transient)."""
        return unpack_rows(self.mask_packed, self.in_features)

    def get_delta_weight(self, adapter: str) -> torch.Tensor:
        """``s · (B A) ⊙ M`` (peft's LoRA delta, masked): pruned positions keep their zeros."""
        delta = super().get_delta_weight(adapter)
        return delta.masked_fill(~self.mask.to(delta.device), 0.0)


class MaskedLoraModelMixin(RecordedBaseTunerMixin):
    """Shared by tuners built on ``LoraModel`` (listed first among the bases; sets ``layer_class``, ``label``)."""

    layer_class: ClassVar[type[nn.Module]]
    label: ClassVar[str]

    @classmethod
    def _create_new_module(cls, lora_config: Any, adapter_name: str, target: nn.Module, **kwargs: Any) -> nn.Module:
        """A ``layer_class`` layer (mask ``W~ ≠ 0`` of the base layer) for an ``nn.Linear`` target."""
        base = target.get_base_layer() if isinstance(target, BaseTunerLayer) else target
        if not isinstance(base, nn.Linear) or kwargs.get("parameter_name") is not None:
            raise ValueError(f"{cls.label} adapts nn.Linear layers only, but target {kwargs.get('target_name')} is a "
                             f"{type(base).__name__}; leave it out of the config's target_modules")
        return cls.layer_class(target, adapter_name, config=lora_config, **kwargs)
