"""Plug-ins: pruners, adapter methods and objectives found by name, the project's own and a user's.

``SPP_PLUGINS=/a:/b`` names a user's method folders; each is imported as ``spp.plugins.<folder>`` by
:func:`load_plugins` before Hydra composes, and ``hydra_plugins/spp_plugins`` adds its ``conf/`` to the search path.
Any process with ``SPP_PLUGINS`` set imports ``spp.plugins.<folder>`` on demand, so a submitit job (which unpickles
the plug-in's classes before anything calls :func:`load_plugins`) finds them."""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

from spp.errors import UserError

PLUGINS_ENV = "SPP_PLUGINS"
"""Environment variable naming plug-in folders, separated by ``os.pathsep`` (``:`` on Linux)."""

NAMESPACE = __name__
"""The package the plug-in folders are imported under (``spp.plugins.<folder name>``): no installed module's name,
so a folder named like one (``random``) is imported and registers."""
__path__: list[str] = []  # a package for the import system: its submodules are the plug-in folders (_FolderFinder)

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


class _FolderFinder(importlib.abc.MetaPathFinder):
    """Finds ``spp.plugins.<name>`` in the ``SPP_PLUGINS`` folder called ``<name>``."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        parent, _, name = fullname.rpartition(".")
        folder = next((p for p in _named() if p.name == name), None) if parent == NAMESPACE else None
        if folder is None or not (folder / "__init__.py").is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


if not any(isinstance(finder, _FolderFinder) for finder in sys.meta_path):
    sys.meta_path.append(_FolderFinder())


def _import_folder(name: str, path: Path) -> ModuleType:
    """Import ``path`` as ``spp.plugins.<name>`` (so a folder named like ``random`` still imports), and as ``<name>``
    where no installed module has it (lm-eval YAML ``!function <name>.loader.load``)."""
    qualified = f"{NAMESPACE}.{name}"
    if getattr(sys.modules.get(qualified), "__file__", None) not in (None, str(path / "__init__.py")):
        del sys.modules[qualified]  # a folder of that name from another SPP_PLUGINS (a test's): import this one
    module = importlib.import_module(qualified)
    if name.isidentifier() and name not in sys.modules and importlib.util.find_spec(name) is None:
        sys.modules[name] = module
    return module


def plugin_conf_dirs() -> list[Path]:
    """The ``conf/`` folders of the plug-ins (what the Hydra search path plug-in adds); no import happens."""
    return [path / "conf" for path in _named() if (path / "conf").is_dir()]
