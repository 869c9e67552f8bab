"""The name of an evaluation's output folder, ``outputs/eval/<model>/<pruner>-<sparsity>/<adapter>-r<r>/<time>``.

Read from an export's ``spp_export.json`` or an ``adapter_dir``'s ``adapter_method.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from spp.export.manifest import ExportManifest


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def eval_run_name(model_path: str | None, model_name: str, pruner: str, sparsity: str,
                  adapter_dir: str | None = None) -> str:
    """``<model>/<pruner>-<sparsity>[/<adapter>-r<r>]`` for what ``eval.py`` evaluates: an export's recorded names
    (its ``spp_export.json``, :class:`spp.export.manifest.ExportManifest`), else the command line's."""
    manifest = ExportManifest.read(model_path)
    if manifest is not None:
        pruning = manifest.pruning or {}
        adapter = manifest.adapter or {}
        name = f"{pruning.get('model', model_name)}/{pruning.get('pruner', pruner)}-{pruning.get('sparsity', sparsity)}"
        method = adapter.get("name")
        if method and method != "none":
            return f"{name}/{method}" + (f"-r{adapter['r']}" if adapter.get("r") is not None else "")
        return f"{name}/{method or 'export'}"
    name = f"{model_name}/{pruner}-{sparsity}"
    if adapter_dir:
        method, rank = adapter_dir_label(Path(str(adapter_dir)).expanduser())
        return f"{name}/{method}" + (f"-r{rank}" if rank is not None else "")
    return name


def adapter_dir_label(path: Path) -> tuple[str, Any]:
    """``(method, r)`` of an adapter directory: its ``adapter_method.json`` (every method's, written by train.py),
    else an older SPP ``adapter_config.json`` or a peft one; ``("adapter", None)`` when unreadable."""
    marker = _read(path / "adapter_method.json")
    if marker is not None:
        return str(marker.get("method") or "adapter"), (marker.get("config") or {}).get("r")
    config = _read(path / "adapter_config.json") or {}
    method = config.get("format") or config.get("peft_type", "adapter")
    return str(method).lower(), (config.get("layer_kwargs") or {}).get("r", config.get("r"))


def register_eval_resolvers() -> None:
    """Register ``spp_eval_name`` (idempotent)."""
    if not OmegaConf.has_resolver("spp_eval_name"):
        OmegaConf.register_new_resolver("spp_eval_name", eval_run_name)
