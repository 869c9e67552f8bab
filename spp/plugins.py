"""Plug-ins: pruners, adapter methods and objectives found by name, the project's own and a user's.

``SPP_PLUGINS=/a:/b`` names a user's method folders; each is imported as ``spp_plugins.<folder>`` by
:func:`load_plugins` before Hydra composes, and ``hydra_plugins/spp_plugins`` adds its ``conf/`` to the search path."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

from spp.errors import UserError

PLUGINS_ENV = "SPP_PLUGINS"
"""Environment variable naming plug-in folders, separated by ``os.pathsep`` (``:`` on Linux)."""

NAMESPACE = "spp_plugins"
"""The package the plug-in folders are imported under (``spp_plugins.<folder name>``): no installed module's name,
so a folder named like one (``random``) is imported and registers."""

log = logging.getLogger(__name__)
_loaded: dict[str, str] = {}


def _named() -> list[Path]:
    """The folders ``SPP_PLUGINS`` names, in order, resolved (empty entries skipped)."""
    return [Path(e).expanduser().resolve() for e in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if e.strip()]


def plugin_dirs() -> list[Path]:
    """The folders ``SPP_PLUGINS`` names, in order; ``UserError`` for one that is not a Python package."""
    paths = _named()
    for path in paths:
        if not (path / "__init__.py").is_file():
            raise UserError(f"{PLUGINS_ENV} names {path}, which is not a plug-in folder (a Python package with an "
                            "__init__.py that registers the method)", f"fix {PLUGINS_ENV} (folders separated by "
                            f"'{os.pathsep}'), or add {path / '__init__.py'}", key=PLUGINS_ENV, path=path)
    return paths


def load_plugins() -> list[str]:
    """Import every plug-in folder of ``SPP_PLUGINS`` once; returns the folder names (``UserError`` on a clash)."""
    names = []
    for path in plugin_dirs():
        name = path.name
        if _loaded.get(name, str(path)) != str(path):
            raise UserError(f"{PLUGINS_ENV} names two plug-in folders called {name!r} ({_loaded[name]} and {path})",
                            "rename one of them (a plug-in's folder name is its module name)", key=PLUGINS_ENV)
        if name not in _loaded:
            _import_folder(name, path)
            _loaded[name] = str(path)
            log.debug("plug-in %s loaded from %s as %s.%s", name, path, NAMESPACE, name)
        names.append(name)
    return names


def _import_folder(name: str, path: Path) -> ModuleType:
    """Import ``path`` as ``spp_plugins.<name>`` (so a folder named like ``random`` still imports), and as ``<name>``
    where no installed module has it (lm-eval YAML ``!function <name>.loader.load``)."""
    parent = sys.modules.get(NAMESPACE)
    if parent is None:
        parent = ModuleType(NAMESPACE, "The plug-in folders of SPP_PLUGINS (spp.plugins).")
        parent.__path__ = []
        sys.modules[NAMESPACE] = parent
    qualified = f"{NAMESPACE}.{name}"
    spec = importlib.util.spec_from_file_location(qualified, path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    assert spec is not None and spec.loader is not None  # a file location always gives a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(qualified, None)
        raise
    setattr(parent, name, module)
    if name.isidentifier() and name not in sys.modules and importlib.util.find_spec(name) is None:
        sys.modules[name] = module
    return module


def plugin_conf_dirs() -> list[Path]:
    """The ``conf/`` folders of the plug-ins (what the Hydra search path plug-in adds); no import happens."""
    return [path / "conf" for path in _named() if (path / "conf").is_dir()]
