"""``adapter=norms``: PERP's normalisation-and-bias retraining (Zimmer et al., arXiv 2312.15230); merge: identity."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from spp.adapters.base import (
    WEIGHTS_NAME,
    AdapterMethod,
    Masks,
    copy_tensors,
    freeze_all,
    read_adapter_files,
    save_tensor_file,
    write_record,
)
from spp.adapters.config import AdapterConfig
from spp.adapters.methods.norms.config import NormsConfig
from spp.projections import DEFAULT_TARGETS, find_projections

FORMAT = "norms"
META_NAME = "norms.json"


def is_norm(module: nn.Module) -> bool:
    """``nn.LayerNorm`` / ``nn.RMSNorm``, or a class named ``*Norm`` with a ``weight`` (HF's ``LlamaRMSNorm``, ...)."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or (
        type(module).__name__.endswith("Norm") and isinstance(getattr(module, "weight", None), nn.Parameter))


def norm_parameters(model: nn.Module, targets: list[str] | tuple[str, ...]) -> dict[str, nn.Parameter]:
    """What ``adapter=norms`` trains: every normalisation parameter and the bias of each ``targets`` linear."""
    out: dict[str, nn.Parameter] = {}
    for name, module in model.named_modules():
        if is_norm(module):
            out.update({f"{name}.{n}" if name else n: p for n, p in module.named_parameters(recurse=False)})
    linears = find_projections(model, targets)  # checked as every method's; the default: every block projection
    return {**out, **{f"{n}.bias": lin.bias for n, lin in linears.items() if lin.bias is not None}}


def save_norms(model: nn.Module, directory: str | os.PathLike, extra: dict[str, Any]) -> Path:
    """``adapter_model.safetensors`` (the trained tensors by parameter name) and ``norms.json`` (their names)."""
    tensors = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}  # what Norms.inject freed
    if not tensors:
        raise ValueError("save_norms: nothing of the model is trainable; inject adapter=norms first")
    out = Path(directory)
    save_tensor_file(out / WEIGHTS_NAME, tensors)
    biases = sorted({n.rsplit(".", 2)[-2] for n in tensors if n.endswith(".bias")
                     and isinstance(model.get_submodule(n.rsplit(".", 1)[0]), nn.Linear)})  # not a LayerNorm's
    write_record(out / META_NAME, FORMAT, extra, targets=biases or list(DEFAULT_TARGETS), tensors=sorted(tensors))
    return out


def load_norms(model: nn.Module, directory: str | os.PathLike) -> tuple[nn.Module, list[str]]:
    """Copy the tensors :func:`save_norms` wrote into the pruned ``model`` (bit-exact); returns it and the targets."""
    meta, state = read_adapter_files(directory, META_NAME, WEIGHTS_NAME, FORMAT, "norms")
    params = dict(model.named_parameters())
    copy_tensors(state, {n: params[n] for n in state if n in params}, str(directory))
    return model, list(meta["targets"])


class Norms(AdapterMethod):
    """Only normalisation weights (and target biases) train; the linear weights, and so their zeros, never move."""

    name = "norms"
    reconstruct_lr = 1e-3  # chosen on validation PPL, SmolLM2-135M Wanda 2:4 (reconstruction_smollm2_135m.md)
    config_class = NormsConfig

    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        freeze_all(model)
        for param in norm_parameters(model, list(cfg.targets)).values():
            param.requires_grad_(True)
        return model

    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        """The identity: the trained tensors are the model's own."""
        freeze_all(model)
        return model, {}

    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        save_norms(model, directory, extra)

    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """``norms.json`` + ``adapter_model.safetensors`` (:func:`load_norms`)."""
        with self.refusing_other_files(directory):
            model, targets = load_norms(model, directory)
        return model, NormsConfig(targets=targets)


METHOD = Norms()
