"""The adapter registry: ``adapter.name`` -> the :class:`~spp.adapters.base.AdapterMethod` its folder registered.

Built-in methods are the packages of ``spp/adapters/methods/`` (imported on first use), plug-ins the folders in
``SPP_PLUGINS``; each config class is stored in Hydra's ConfigStore as ``adapter/<name>_schema``.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from torch import nn

from spp.adapters.base import (
    AdapterMethod,
    Masks,
    check_tensor_file,
    count_parameters,
    read_json_file,
    write_json_file,
)
from spp.adapters.config import AdapterConfig, adapter_record
from spp.adapters.trained_on import RECORD, check_base
from spp.errors import UserError
from spp.models.conv1d import linearize_conv1d
from spp.paths import CONF_DIR
from spp.projections import current_masks
from spp.registry import Registry, defined_in
from spp.version import __version__

METHODS_DIR = Path(__file__).resolve().parent / "methods"
"""One package per built-in method (``spp``, ``lora``, ``none``, ...)."""
MARKER = "adapter_method.json"
"""Written beside every method's adapter files: which method wrote them (what ``eval.py adapter_dir=`` loads)."""

METHODS: Registry[AdapterMethod] = Registry("adapter method", "adapter.name", group="adapter")
"""Every adapter method by name (:func:`register`; the built-in ones are imported on first use)."""
_builtin_loaded = False


def register(method: AdapterMethod) -> AdapterMethod:
    """Register ``method`` under ``method.name`` and its config class as Hydra's ``adapter/<name>_schema``.

    Built-ins register first, so a plug-in taking one of their names is refused (UserError naming both files), as is
    one that audits adapted layers it cannot merge (``effective_weight`` without ``merged_layer``), and a plug-in
    that merges layers the audit cannot see (``merged_layer`` without ``effective_weight``; LoRA* audits peft's
    ``base_layer`` and re-masks only at the merge).
    """
    if not isinstance(method, AdapterMethod):
        raise TypeError(f"register: expected an AdapterMethod instance, got {type(method).__name__}")
    cls = method.config_class
    if not (isinstance(cls, type) and issubclass(cls, AdapterConfig)):
        raise TypeError(f"adapter {method.name!r}: config_class must subclass spp.adapters.config.AdapterConfig")
    if not method.name or not method.name.isidentifier():
        raise UserError(f"adapter method {type(method).__name__} ({defined_in(method)}): name {method.name!r} is "
                        "not an identifier", f"set {type(method).__name__}.name to the option's name")
    own = type(method)
    if own.effective_weight is not AdapterMethod.effective_weight and own.merged_layer is AdapterMethod.merged_layer:
        raise UserError(f"adapter method {own.__name__} ({defined_in(method)}) says what its adapted layers apply "
                        "(effective_weight) but not how they merge: the export would fail after training",
                        f"define {own.__name__}.merged_layer (docs/architecture.md, 'How to add an adapter method')")
    if own.merged_layer is not AdapterMethod.merged_layer and own.effective_weight is AdapterMethod.effective_weight \
            and not Path(defined_in(method)).resolve().is_relative_to(METHODS_DIR):  # a plug-in's wrapped layers
        raise UserError(f"adapter method {own.__name__} ({defined_in(method)}) says how its adapted layers merge "
                        "(merged_layer) but not what they apply: the sparsity audit would not find them at fit start",
                        f"define {own.__name__}.effective_weight (docs/architecture.md: How to add an adapter method)")
    load_builtin()
    METHODS.register(method.name, method, cls)
    return method


def load_builtin() -> None:
    """Import every package of ``spp/adapters/methods/`` once (each registers its method)."""
    global _builtin_loaded
    if _builtin_loaded:
        return
    _builtin_loaded = True
    for info in pkgutil.iter_modules([str(METHODS_DIR)]):
        if info.ispkg and not info.name.startswith("_"):
            importlib.import_module(f"spp.adapters.methods.{info.name}")


def method_names() -> tuple[str, ...]:
    """Every registered adapter method (the built-in ones and the plug-ins loaded), sorted."""
    load_builtin()
    return tuple(METHODS.names())


def registered_methods() -> list[AdapterMethod]:
    """Every registered adapter method, sorted by name."""
    return [METHODS.get(name) for name in method_names()]


def get_method(name: str) -> AdapterMethod:
    """The registered method called ``name`` (UserError listing the registered ones)."""
    load_builtin()
    return METHODS.get(name)


def make_config(name: str, **values: Any) -> AdapterConfig:
    """The config of method ``name`` with ``values`` (the method's own dataclass; checked by its ``__post_init__``)."""
    return get_method(name).config_class(name=name, **values)


def option_config(name: str, conf_dir: Path | None = None, **overrides: Any) -> AdapterConfig:
    """The typed config ``adapter=<name>`` composes to (schema, its YAML, ``overrides``), without Hydra."""
    from omegaconf import OmegaConf

    yaml = OmegaConf.load(Path(conf_dir or CONF_DIR) / "adapter" / f"{name}.yaml")
    values = {k: v for k, v in OmegaConf.to_container(yaml).items() if k != "defaults"}
    node = OmegaConf.merge(OmegaConf.structured(get_method(name).config_class), values, overrides)
    return OmegaConf.to_object(node)


def apply_adapter(model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, list[str]]:
    """Attach the configured adapter, freeze the rest; returns ``(model, trainable parameter names)``."""
    method = get_method(cfg.name)
    linearize_conv1d(model)  # a caller-built GPT-2: Conv1D as nn.Linear
    model = method.inject(model, cfg, masks)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if method.trains and not trainable:
        raise ValueError(f"adapter.targets={list(cfg.targets)} matched no parameter of the model to train; "
                         "fix adapter.targets")
    return model, trainable


def merge_adapter(model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
    """Fold the adapter into the weights (the method's merge); returns a plain HF model and merge statistics."""
    return get_method(cfg.name).merge(model, cfg, masks)


# ------------------------------------------------------------------------------------------------ adapter files


def save_adapter_dir(method: AdapterMethod, model: nn.Module, directory: Path, extra: dict[str, Any],
                     cfg: AdapterConfig | None = None) -> None:
    """The method's adapter files plus :data:`MARKER` (method, config, the base it was trained on)."""
    record = extra.get(RECORD)
    method.save(model, directory, {k: v for k, v in extra.items() if k != RECORD})
    config = adapter_record(cfg) if cfg is not None else {}
    marker = {"method": method.name, "config": config, "spp_version": __version__, RECORD: record}
    write_json_file(Path(directory) / MARKER, marker)


def check_adapter_files(directory: str | Path, key: str = "adapter_dir") -> None:
    """Check every ``*.json`` and ``*.safetensors`` of an adapter folder is whole, before any model loads."""
    path = Path(directory).expanduser()
    for file in sorted(path.glob("*.json")):
        read_json_file(file, key)
    for file in sorted(path.glob("*.safetensors")):
        check_tensor_file(file, key)


def _peft_folder_method(peft_type: Any) -> str | None:
    """The method whose peft form writes ``peft_type`` (the one named like the form where several share it)."""
    found = [(m.name, form.name) for m in registered_methods()
             if (form := m.peft_integration()) is not None and form.name.upper() == peft_type]
    return min(found, key=lambda pair: pair[0] != pair[1])[0] if found else None


def _read_marker(path: Path) -> dict[str, Any]:
    """The :data:`MARKER` of an adapter directory; a marker-less SPP folder, or peft's ``save_pretrained`` of a
    method's peft form, is read from ``adapter_config.json`` (its recorded base in ``spp_trained_on``)."""
    if (path / MARKER).is_file():
        return read_json_file(path / MARKER)
    if (path / "adapter_config.json").is_file():
        saved = read_json_file(path / "adapter_config.json")
        if saved.get("format") == "spp":
            return {"method": "spp", "config": dict(saved.get("layer_kwargs") or {})}
        return {"method": _peft_folder_method(saved.get("peft_type")), RECORD: saved.get("spp_trained_on")}
    return {}


def trained_on(directory: str | Path) -> dict[str, Any] | None:
    """The base the adapter folder records it was trained on; ``None`` for a folder without the record."""
    return _read_marker(Path(directory).expanduser()).get(RECORD) or None


def describe_dir(directory: str | Path) -> tuple[AdapterMethod, dict[str, Any]]:
    """The method that wrote the adapter directory and its recorded config (UserError if not one / unregistered)."""
    path = Path(directory).expanduser()
    marker = _read_marker(path)
    check_adapter_files(path)
    name = marker.get("method")
    if not name:
        raise UserError(f"adapter_dir={str(directory)!r} is not an adapter directory (no {MARKER})",
                        "point adapter_dir= at the adapter folder a train.py run wrote (<run_dir>/adapter)",
                        key="adapter_dir", path=path)
    if name not in method_names():
        raise UserError(f"adapter_dir={str(directory)!r} was written by adapter method {name!r}, which is not "
                        "registered here", f"name its plug-in folder in SPP_PLUGINS (registered: "
                        f"{list(method_names())})", key="adapter_dir", path=path)
    return get_method(name), dict(marker.get("config") or {})


def load_adapter_dir(model: nn.Module, directory: str | Path, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
    """``model`` with the adapter of ``directory`` loaded and merged; returns it and ``{"method", "r", "merge"}``.

    Refuses a base other than the one the folder records (a folder without the record loads with a warning).
    """
    method = describe_dir(directory)[0]
    check_base(trained_on(directory), model, f"adapter_dir={str(directory)!r}", path=directory)
    masks = masks or current_masks(model)
    adapted, cfg = method.load(model, Path(directory).expanduser(), masks)
    merged, stats = method.merge(adapted, cfg, masks)
    return merged, {"method": method.name, "r": method.rank(cfg), "merge": stats}


__all__ = ["AdapterMethod", "apply_adapter", "count_parameters", "describe_dir", "get_method",
           "check_adapter_files", "load_adapter_dir", "make_config", "merge_adapter", "method_names",
           "option_config", "register", "save_adapter_dir", "trained_on"]
