"""SparsePEFT (SQFT, ``adapter=sparse_lora``) as a registered peft method (``peft_type: SPARSE_LORA``).

The layers are spp's own ``SparseLoraLinear`` (mask ``M = W~ ≠ 0``), merging ``W~ + s·(B A) ⊙ M`` (zeros kept).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from peft import LoraConfig, LoraModel, PeftModel
from torch import nn

from spp.adapters.base import PeftIntegration, read_json_file
from spp.adapters.methods.sparse_lora.config import SparseLoRAConfig as _SppDefaults
from spp.adapters.methods.sparse_lora.layer import FORMAT, META_NAME, PEFT_TYPE, SparseLoraLinear, check_mask_sizes
from spp.adapters.peft_base import MaskedLoraConfigMixin, MaskedLoraModelMixin, read_peft_folder
from spp.projections import DEFAULT_TARGETS


@dataclass
class SparseLoraConfig(MaskedLoraConfigMixin, LoraConfig):
    """SparsePEFT for ``peft.get_peft_model``: a ``LoraConfig`` with spp's ``adapter=sparse_lora`` defaults.

    ``target_modules`` ``None`` or the default list = every decoder-block projection; ``use_dora``, ``fan_in_fan_out``
    and ``lora_bias`` are refused.
    """

    spp_name: ClassVar[str] = "sparse_lora"  # PeftType.SPARSE_LORA
    masks: ClassVar[str] = "SparsePEFT masks a plain LoRA update of nn.Linear layers"

    target_modules: list[str] | str | None = field(default_factory=lambda: list(DEFAULT_TARGETS))
    r: int = _SppDefaults.r
    lora_alpha: float = _SppDefaults.lora_alpha
    lora_dropout: float = _SppDefaults.dropout
    spp_trained_on: dict[str, Any] | None = None


class SparseLoraModel(MaskedLoraModelMixin, LoraModel):
    """peft's LoRA tuner with ``SparseLoraLinear`` layers, in ``inject_sparse_lora``'s order (same initial ``A``)."""

    layer_class: ClassVar[type[nn.Module]] = SparseLoraLinear
    label: ClassVar[str] = "SparsePEFT"


def _read_meta(path: Path, directory: str | os.PathLike) -> dict[str, Any] | None:
    """``sparse_lora.json`` (``None`` when absent), the folder checked to be SparsePEFT."""
    kind = read_peft_folder(path, directory, "a SparsePEFT adapter folder (a train.py run's <run_dir>/adapter with "
                            "adapter=sparse_lora)").get("peft_type")
    meta = read_json_file(path / META_NAME, key="adapter folder") if (path / META_NAME).is_file() else None
    if kind == "LORA" and (meta or {}).get("format") != FORMAT:
        raise ValueError(f"{str(directory)!r} is a plain LoRA adapter (peft_type='LORA', no {META_NAME}); load it "
                         "with peft.PeftModel.from_pretrained")
    if kind not in ("LORA", PEFT_TYPE):
        raise ValueError(f"{str(directory)!r} is not a SparsePEFT adapter (peft_type={kind!r})")
    return meta


def from_sparse_lora_adapter(model: nn.Module, directory: str | os.PathLike, adapter_name: str = "default",
                             is_trainable: bool = False, **kwargs: Any) -> PeftModel:
    """``PeftModel.from_pretrained`` for a SparsePEFT folder, even an old ``"LORA"`` + ``sparse_lora.json`` one.

    ``PeftModel.from_pretrained`` alone would read such a folder as plain LoRA (its merge fills the pruned zeros).
    """
    path = Path(directory).expanduser()
    meta = _read_meta(path, directory)
    config = SparseLoraConfig.from_pretrained(str(path))
    loaded = PeftModel.from_pretrained(model, str(path), adapter_name=adapter_name, is_trainable=is_trainable,
                                       config=config, **kwargs)
    check_mask_sizes(loaded, meta, directory)
    return loaded


SPARSE_LORA_PEFT = PeftIntegration(SparseLoraConfig.spp_name, SparseLoraConfig, SparseLoraModel, SparseLoraModel.prefix,
                                   (SparseLoraConfig, SparseLoraModel, from_sparse_lora_adapter))
"""What ``spp.peft`` registers with peft and exports for SparsePEFT."""
