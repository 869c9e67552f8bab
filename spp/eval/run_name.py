"""The name of an evaluation's output folder, ``outputs/eval/<model>/<pruner>-<sparsity>/<adapter>-r<r>/<time>``.

Read from an export's ``spp_export.json`` or an ``adapter_dir``'s ``adapter_method.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from spp.export.manifest import EXPORT_FILE, ExportManifest


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_origin(model_path: str | None, model_name: str, pruner: str, sparsity: str,
               adapter_dir: str | None = None) -> dict[str, Any]:
    """What is evaluated, by origin, for the output folder (:func:`eval_run_name`) and the W&B run
    (:func:`spp.eval.runner.job_loggers`) alike: an export's recorded run (``spp_export.json``,
    :class:`spp.export.manifest.ExportManifest`: model, pruner, sparsity, adapter and rank), each name it does not
    record taken from the command line (an adapter it does not record is ``export``); else the command line's names
    with the ``adapter_dir``'s method and rank."""
    manifest = ExportManifest.read(model_path)
    if manifest is not None:
        pruning, adapter = manifest.pruning, manifest.adapter
        return {"model": pruning.get("model", model_name), "pruner": pruning.get("pruner", pruner),
                "sparsity": pruning.get("sparsity", sparsity), "adapter": adapter.get("name") or "export",
                "r": adapter.get("r"), "pruning_cache_key": pruning.get("cache_key"), "recorded_in": EXPORT_FILE}
    method, r = adapter_dir_label(Path(str(adapter_dir)).expanduser()) if adapter_dir else ("none", None)
    return {"model": model_name, "pruner": pruner, "sparsity": sparsity, "adapter": method, "r": r,
            "pruning_cache_key": None, "recorded_in": "command line"}


def eval_run_name(model_path: str | None, model_name: str, pruner: str, sparsity: str,
                  adapter_dir: str | None = None) -> str:
    """``<model>/<pruner>-<sparsity>[/<adapter>[-r<r>]]`` of :func:`run_origin` (an export always names its adapter,
    ``none`` included)."""
    origin = run_origin(model_path, model_name, pruner, sparsity, adapter_dir)
    name = f"{origin['model']}/{origin['pruner']}-{origin['sparsity']}"
    if origin["adapter"] == "none" and origin["recorded_in"] != EXPORT_FILE:
        return name
    r = origin["r"] if origin["adapter"] != "none" else None
    return f"{name}/{origin['adapter']}" + (f"-r{r}" if r is not None else "")


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
