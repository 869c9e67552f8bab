"""SparsePEFT (SQFT, ``adapter=sparse_lora``) as a registered peft method (``peft_type: SPARSE_LORA``).

LoRA whose update is masked by the pruning mask ``M``: the layer computes ``y = x W~ᵀ + s · xd ((B A) ⊙ M)ᵀ`` and
merges into ``W = W~ + s·(B A) ⊙ M``, so every pruned zero stays zero (bit for bit). The layers are spp's own
:class:`~spp.adapters.methods.sparse_lora.layer.SparseLoraLinear` (``adapter=sparse_lora``'s), with the mask taken
from the base weight (``M = W~ ≠ 0``, SQFT's definition; the pruning mask itself for a pruned model). Tensors and
file keys are LoRA's (``lora_A`` / ``lora_B``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peft import LoraConfig, LoraModel, PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from spp.adapters.base import read_json_file
from spp.adapters.methods.lora.config import LoRAConfig as _SppDefaults
from spp.adapters.methods.sparse_lora.layer import FORMAT, META_NAME, PEFT_TYPE, SparseLoraLinear, sparse_lora_layers
from spp.models.conv1d import linearize_conv1d
from spp.peft.architecture import resolve_default_targets
from spp.peft.base_record import check, from_folder
from spp.peft.registration import SPARSE_LORA_NAME, SPARSE_LORA_PREFIX, peft_type
from spp.projections import DEFAULT_TARGETS

UNSUPPORTED = ("use_dora", "fan_in_fan_out", "lora_bias")
"""LoRA settings SparsePEFT has no masked form of."""


@dataclass
class SparseLoraConfig(LoraConfig):
    """SparsePEFT for ``peft.get_peft_model``: a ``LoraConfig`` (same keys) whose update is masked by the pruning
    mask in training and in the merge ``W~ + s·(B A) ⊙ M`` (zeros kept).

    Defaults are spp's ``adapter=sparse_lora`` (the paper's LoRA* baseline): ``r=8``, ``lora_alpha=16``,
    ``lora_dropout=0.05``; ``target_modules`` ``None`` or the default list = every linear projection of the model's
    decoder blocks. ``use_dora``, ``fan_in_fan_out`` and ``lora_bias`` are refused.
    """

    target_modules: list[str] | str | None = field(default_factory=lambda: list(DEFAULT_TARGETS))
    r: int = _SppDefaults.r
    lora_alpha: float = _SppDefaults.lora_alpha
    lora_dropout: float = _SppDefaults.dropout
    spp_trained_on: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = peft_type(SPARSE_LORA_NAME)
        bad = [key for key in UNSUPPORTED if getattr(self, key)]
        if bad:
            raise ValueError(f"SparseLoraConfig: {bad[0]}={getattr(self, bad[0])!r} is not supported (SparsePEFT masks "
                             "a plain LoRA update of nn.Linear layers); leave it at its default")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, subfolder: str | None = None,
                        **kwargs: Any) -> SparseLoraConfig:
        """peft's ``from_pretrained``, the folder's files checked and its recorded base in ``spp_trained_on``."""
        return from_folder(lambda: super(SparseLoraConfig, cls).from_pretrained(pretrained_model_name_or_path,
                                                                                subfolder, **kwargs),
                           pretrained_model_name_or_path, subfolder)

    @classmethod
    def check_kwargs(cls, **kwargs: Any) -> dict[str, Any]:
        """``SparseLoraConfig.from_pretrained`` also reads a folder spp wrote before it recorded
        ``"peft_type": "SPARSE_LORA"`` (``"LORA"`` there)."""
        if kwargs.get("peft_type") == "LORA":
            kwargs["peft_type"] = PEFT_TYPE
        return super().check_kwargs(**kwargs)


class SparseLoraModel(LoraModel):
    """peft's LoRA tuner whose layers are spp's ``SparseLoraLinear`` (in ``named_modules`` order, as
    ``inject_sparse_lora``: same initial ``A`` from the same seed); default targets and GPT-2 as in
    :mod:`spp.peft.architecture`."""

    prefix: str = SPARSE_LORA_PREFIX

    def _prepare_adapter_config(self, peft_config: LoraConfig, model_config: dict) -> LoraConfig:
        """``target_modules`` ``None`` or the default list: the model's block projections."""
        resolve_default_targets(peft_config, self.model)
        return super()._prepare_adapter_config(peft_config, model_config)

    def _prepare_model(self, peft_config: LoraConfig, model: nn.Module) -> None:
        """GPT-2's ``Conv1D`` layers become ``nn.Linear`` (their state dict keeps ``Conv1D``'s layout); a folder's
        adapter is refused on another base than the one it records (:func:`spp.peft.base_record.check`)."""
        linearize_conv1d(model)  # GPT-2's Conv1D held as nn.Linear, in place
        check(peft_config, model)
        super()._prepare_model(peft_config, model)

    @staticmethod
    def _create_new_module(lora_config: LoraConfig, adapter_name: str, target: nn.Module,
                           **kwargs: Any) -> nn.Module:
        """A ``SparseLoraLinear`` (mask ``W~ ≠ 0`` of the base layer) for an ``nn.Linear`` target."""
        base = target.get_base_layer() if isinstance(target, BaseTunerLayer) else target
        if not isinstance(base, nn.Linear) or kwargs.get("parameter_name") is not None:
            raise ValueError(f"SparsePEFT adapts nn.Linear layers only, but target {kwargs.get('target_name')} is a "
                             f"{type(base).__name__}; leave it out of SparseLoraConfig.target_modules")
        return SparseLoraLinear(target, adapter_name, config=lora_config, **kwargs)


def _read_meta(path: Path, directory: str | os.PathLike) -> dict[str, Any] | None:
    """``sparse_lora.json`` of a SparsePEFT folder (``None`` when absent: peft's ``save_pretrained``), the folder
    checked to be SparsePEFT (``SPARSE_LORA``, or ``LORA`` with the marker)."""
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"No {name} in {str(directory)!r}; point at a SparsePEFT adapter folder (a "
                                    "train.py run's <run_dir>/adapter with adapter=sparse_lora)")
    kind = read_json_file(path / "adapter_config.json", key="adapter folder").get("peft_type")
    meta = read_json_file(path / META_NAME, key="adapter folder") if (path / META_NAME).is_file() else None
    if kind == "LORA" and (meta or {}).get("format") != FORMAT:
        raise ValueError(f"{str(directory)!r} is a plain LoRA adapter (peft_type='LORA', no {META_NAME}); load it "
                         "with peft.PeftModel.from_pretrained")
    if kind not in ("LORA", PEFT_TYPE):
        raise ValueError(f"{str(directory)!r} is not a SparsePEFT adapter (peft_type={kind!r})")
    return meta


def _check_mask_sizes(model: PeftModel, meta: dict[str, Any] | None, directory: str | os.PathLike) -> None:
    """Each layer's mask size against ``sparse_lora.json`` (a base pruned otherwise has other sizes)."""
    if not meta or "layers" not in meta:
        return
    kept = {name: int(layer.mask.sum()) for name, layer in sparse_lora_layers(model)}
    if kept != meta["layers"]:
        differ = sorted(k for k in set(kept) | set(meta["layers"]) if kept.get(k) != meta["layers"].get(k))
        raise ValueError(f"layers or mask sizes differ from {str(directory)!r} at {differ[:3]}; load the adapter on "
                         "the pruned model it was trained on")


def from_sparse_lora_adapter(model: nn.Module, directory: str | os.PathLike, adapter_name: str = "default",
                             is_trainable: bool = False, **kwargs: Any) -> PeftModel:
    """``PeftModel.from_pretrained(model, directory)`` for a SparsePEFT folder, including one spp wrote before it
    recorded ``"peft_type": "SPARSE_LORA"`` (``"LORA"`` + ``sparse_lora.json``), which ``PeftModel.from_pretrained``
    alone would read as plain LoRA (its merge would fill the pruned zeros).

    Args:
        model: The pruned base model the adapter was trained on (plain HF module).
        directory: A train.py ``adapter=sparse_lora`` folder, or peft's ``save_pretrained`` of a SparsePEFT model.
        adapter_name, is_trainable, **kwargs: As ``PeftModel.from_pretrained``.

    Raises:
        FileNotFoundError: a file is missing. ValueError: not a SparsePEFT adapter, or mask sizes that differ from
            ``sparse_lora.json`` (a base pruned otherwise).
    """
    path = Path(directory).expanduser()
    meta = _read_meta(path, directory)
    config = SparseLoraConfig.from_pretrained(str(path))
    loaded = PeftModel.from_pretrained(model, str(path), adapter_name=adapter_name, is_trainable=is_trainable,
                                       config=config, **kwargs)
    _check_mask_sizes(loaded, meta, directory)
    return loaded
