"""SparsePEFT (SQFT, Muñoz et al., arXiv 2410.03750): LoRA whose update is masked.

Training ``y = x W~ᵀ + s · dropout(x) · ((B A) ⊙ M)ᵀ``; merge ``W = W~ + s · (B A) ⊙ M`` (every zero stays), with
``M ∧ (W~ ≠ 0)`` (SQFT's) as the mask; no m x n float survives the forward.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.lora.layer import LoraVariant
from peft.utils import load_peft_weights, set_peft_model_state_dict
from torch import nn

from spp.adapters.base import CONFIG_NAME, Full, check_masks_cover, read_json_file, write_record
from spp.adapters.chunks import ModulatedLowRankFunction
from spp.adapters.peft_base import MaskedLoraLinear, lora_config, read_lora_settings, save_as_peft_type
from spp.bitmask import checked_mask, pack_rows, unpack_rows
from spp.projections import DEFAULT_TARGETS

FORMAT = "sparse_lora"
META_NAME = "sparse_lora.json"
PEFT_TYPE = "SPARSE_LORA"
"""``adapter_config.json``'s ``peft_type`` (older folders say ``"LORA"``; spp's loader reads both)."""


def masked_lora(xd: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, packed_mask: torch.Tensor,
                scale: float) -> torch.Tensor:
    """The SparsePEFT branch ``s · xd · ((B A) ⊙ M)ᵀ`` (``packed_mask``: :func:`~spp.bitmask.pack_rows`), with
    hand-written gradients: with ``G = s (gᵀ xd) ⊙ M``, ``dB = G Aᵀ``, ``dA = Bᵀ G``, ``dxd = s g ((B A) ⊙ M)``."""
    return ModulatedLowRankFunction.apply(xd, lora_a, lora_b, None, packed_mask, float(scale))


def _merged_weight(module: SparseLoraLinear, adapter: str, weight: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    """``W~ ± s·(B A) ⊙ M`` rounded once to the weight's dtype; pruned positions are ``weight``'s own bits."""
    cdt = torch.promote_types(weight.dtype, torch.float32)
    delta = module.get_delta_weight(adapter).to(cdt)
    summed = torch.add(weight.detach().to(cdt), delta, alpha=sign).to(weight.dtype)
    return torch.where(module.mask, summed, weight.detach())


class SparseLoraVariant(LoraVariant):
    """peft LoRA variant: the update ``s·(B A)`` masked by the layer's pruning mask in forward, merge and unmerge."""

    def supports_lora_conversion(self) -> bool:
        """A masked update is not a rank-r LoRA: no conversion to vanilla LoRA."""
        return False

    @staticmethod
    def init(module: LoraLinear, adapter_name: str, **kwargs: Any) -> None:
        """Nothing to add per adapter: the mask belongs to the layer (one per weight, shared by adapters)."""

    @staticmethod
    def merge_safe(module: LoraLinear, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        return _merged_weight(module, active_adapter, orig_weight)

    @staticmethod
    def merge_unsafe(module: LoraLinear, active_adapter: str, orig_weight: torch.Tensor) -> None:
        orig_weight.data.copy_(_merged_weight(module, active_adapter, orig_weight))

    @staticmethod
    def unmerge(module: LoraLinear, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        return _merged_weight(module, active_adapter, orig_weight, sign=-1.0)

    @staticmethod
    def forward(module: LoraLinear, active_adapter: str, x: torch.Tensor, result: torch.Tensor,
                **kwargs: Any) -> torch.Tensor:
        xd = module.lora_dropout[active_adapter](x)
        update = masked_lora(xd, module.lora_A[active_adapter].weight, module.lora_B[active_adapter].weight,
                             module.mask_packed, module.scaling[active_adapter])
        return result + update


class SparseLoraLinear(MaskedLoraLinear):
    """peft ``lora.Linear`` with a bit-packed mask buffer (starts as ``W~ ≠ 0``) and :class:`SparseLoraVariant`."""

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: LoraConfig, **kwargs: Any) -> None:
        if config.fan_in_fan_out or config.lora_bias:
            raise ValueError("sparse_lora supports nn.Linear layers without fan_in_fan_out and without lora_bias")
        super().__init__(base_layer, adapter_name, config=config, **kwargs)

    @property
    def lora_variants(self) -> dict[tuple[str, ...], type[LoraVariant] | None]:
        return {(): SparseLoraVariant}

    def set_mask(self, mask: torch.Tensor) -> None:
        """Use ``mask ∧ (W~ ≠ 0)``; ``mask`` must be bool (out x in) with every pruned weight already zero."""
        weight = self.get_base_layer().weight.detach()
        self.mask_packed = pack_rows(mask.to(weight.device) & (weight != 0))

    @torch.no_grad()
    def delta_sq_norm(self) -> float:
        """``‖s·(B A) ⊙ M‖²_F`` summed over the active adapters (what the merge adds), in float64."""
        return sum(float(self.get_delta_weight(a).double().square().sum()) for a in self.active_adapters
                   if a in self.lora_A)

    @torch.no_grad()
    def effective_weight(self, full: Full = lambda t: t) -> torch.Tensor:
        """The applied weight ``W~ + s·(B A) ⊙ M`` (fp32 or wider); ``full`` unshards (a collective: every rank)."""
        weight = full(self.get_base_layer().weight.detach())
        cdt = torch.promote_types(weight.dtype, torch.float32)
        if self.merged or self.disable_adapters:
            return weight.to(cdt)
        delta = torch.zeros(weight.shape, dtype=cdt, device=weight.device)
        for adapter in self.active_adapters:
            if adapter in self.lora_A:
                lora_a, lora_b = full(self.lora_A[adapter].weight.detach()), full(self.lora_B[adapter].weight.detach())
                delta += (lora_b.to(cdt) @ lora_a.to(cdt)) * self.scaling[adapter]
        return torch.where(self.mask.to(weight.device), weight.to(cdt) + delta, weight.to(cdt))

    def __repr__(self) -> str:
        return "sparse_" + super().__repr__()


def sparse_lora_layers(model: nn.Module) -> Iterator[tuple[str, SparseLoraLinear]]:
    """The ``(original module name, layer)`` pairs (``model.layers.0.self_attn.q_proj``) of a SparsePEFT model."""
    root = model.base_model.model if isinstance(model, PeftModel) else model
    return ((name, module) for name, module in root.named_modules() if isinstance(module, SparseLoraLinear))


def inject_sparse_lora(
    model: nn.Module,
    masks: Mapping[str, torch.Tensor] | None = None,
    targets: Sequence[str] = DEFAULT_TARGETS,
    r: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.05,
    dtype: torch.dtype = torch.float32,
    task_type: str | None = "CAUSAL_LM",
) -> PeftModel:
    """Wrap ``model`` with SparsePEFT layers on ``targets`` (``B = 0``: output unchanged); only ``A``/``B`` train.

    ``masks`` (True = kept) must cover every adapted layer (``None``/empty: the non-zeros); ValueError if one prunes a
    non-zero weight.
    """
    return wrap_masked(model, lora_config(model, targets, r, alpha, dropout, task_type), masks, dtype, "sparse_lora")


def wrap_masked(model: nn.Module, config: LoraConfig, masks: Mapping[str, torch.Tensor] | None, dtype: torch.dtype,
                method: str) -> PeftModel:
    """``model`` wrapped in :class:`SparseLoraLinear` layers per ``config``, masks set, ``A``/``B`` in ``dtype``."""
    config._register_custom_module({nn.Linear: SparseLoraLinear})
    peft_model = get_peft_model(model, config)
    layers = dict(sparse_lora_layers(peft_model))
    check_masks_cover(method, layers, masks)
    if masks:
        for name, layer in layers.items():
            layer.set_mask(checked_mask(name, masks[name], layer.get_base_layer().weight))
    for layer in layers.values():
        for module in (*layer.lora_A.values(), *layer.lora_B.values()):
            module.to(dtype=dtype)
    return peft_model


@torch.no_grad()
def merge_sparse_lora(model: PeftModel) -> tuple[nn.Module, dict[str, Any]]:
    """Merge ``W = W~ + s·(B A) ⊙ M``, unwrap; returns the model, ``{"layers", "delta_sq_norm", "pruned_nonzero"}``."""
    layers = dict(sparse_lora_layers(model))
    if not layers:
        raise ValueError("merge_sparse_lora: the model holds no SparsePEFT layer (nothing to merge)")
    packed = {name: (layer.mask_packed, layer.in_features) for name, layer in layers.items()}
    delta_sq = sum(layer.delta_sq_norm() for layer in layers.values())
    plain = model.merge_and_unload()
    modules = dict(plain.named_modules())
    pruned_nonzero = sum(int(((modules[name].weight != 0) & ~unpack_rows(p, n)).sum())
                         for name, (p, n) in packed.items())
    return plain, {"layers": len(layers), "delta_sq_norm": delta_sq, "pruned_nonzero": pruned_nonzero}


def save_sparse_lora(model: PeftModel, directory: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
    """peft's files (``"peft_type": "SPARSE_LORA"``, so peft without ``spp.peft`` refuses) plus ``sparse_lora.json``."""
    layers = dict(sparse_lora_layers(model))
    if not layers:
        raise ValueError("save_sparse_lora: the model holds no SparsePEFT layer; call inject_sparse_lora first")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_as_peft_type(model, out, PEFT_TYPE)
    write_record(out / META_NAME, FORMAT, extra, layers={name: int(layer.mask.sum()) for name, layer in layers.items()})
    return out


def read_lora_config(directory: str | os.PathLike) -> tuple[LoraConfig, bool]:
    """A SparsePEFT folder's LoRA settings and whether it says ``SPARSE_LORA`` (read without peft's registry)."""
    return read_lora_settings(directory, PEFT_TYPE, "SparsePEFT", "a directory written by save_sparse_lora")


def _read_meta(path: Path) -> dict[str, Any] | None:
    """``sparse_lora.json`` (checked); ``None`` for a ``SPARSE_LORA`` folder from peft's ``save_pretrained``."""
    meta_path = path / META_NAME
    if not meta_path.is_file():
        if (path / CONFIG_NAME).is_file() and read_lora_config(path)[1]:
            return None
        raise FileNotFoundError(f"No {META_NAME} in {path}; expected a directory written by save_sparse_lora")
    meta = read_json_file(meta_path)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path} is not a SparsePEFT adapter (format={meta.get('format')!r})")
    return meta


def check_mask_sizes(model: nn.Module, meta: dict[str, Any] | None, directory: str | os.PathLike) -> None:
    """Each layer's mask size against ``sparse_lora.json`` (another pruned base differs); no record, no check."""
    if not meta or "layers" not in meta:
        return
    kept = {name: int(layer.mask.sum()) for name, layer in sparse_lora_layers(model)}
    if kept != meta["layers"]:
        differ = sorted(k for k in set(kept) | set(meta["layers"]) if kept.get(k) != meta["layers"].get(k))
        raise ValueError(f"layers or mask sizes differ from {str(directory)!r} at {differ[:3]}; load the adapter on "
                         "the pruned model it was trained on")


def load_sparse_lora(model: nn.Module, directory: str | os.PathLike,
                     masks: Mapping[str, torch.Tensor] | None = None) -> PeftModel:
    """Re-create the SparsePEFT model :func:`save_sparse_lora` (or peft) wrote on the same pruned base ``model``.

    ``masks=None`` uses the non-zeros; layers, mask sizes or tensor names that differ raise ``ValueError``.
    """
    def inject(config: LoraConfig, dtype: torch.dtype) -> PeftModel:
        return inject_sparse_lora(model, masks, targets=sorted(config.target_modules), r=config.r,
                                  alpha=config.lora_alpha, dropout=config.lora_dropout, dtype=dtype)

    return load_masked(directory, _read_meta(Path(directory)), inject, "load_sparse_lora")[0]


def load_masked(directory: str | os.PathLike, meta: dict[str, Any] | None,
                inject: Callable[[LoraConfig, torch.dtype], PeftModel], label: str) -> tuple[PeftModel, LoraConfig]:
    """A masked-LoRA folder's model (``inject(settings, dtype)``, SparsePEFT's or LoSA's), its mask sizes checked
    against ``meta`` and its tensors loaded, and its LoRA settings; ``ValueError`` when the tensor names differ."""
    config, _ = read_lora_config(directory)
    state = load_peft_weights(str(directory), device="cpu")
    peft_model = inject(config, next(iter(state.values())).dtype)
    check_mask_sizes(peft_model, meta, directory)
    result = set_peft_model_state_dict(peft_model, state)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"{label}: tensors differ from the model: unexpected {result.unexpected_keys[:3]}, "
                         f"missing {missing[:3]}")
    return peft_model, config
