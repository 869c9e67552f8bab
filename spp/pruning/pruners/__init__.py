"""The project's own pruners, one folder each, imported so that each folder's ``__init__`` registers it.
A new folder is found without editing this file; a user's pruner lives outside ``spp/`` (``SPP_PLUGINS``)."""

from __future__ import annotations

import importlib
import pkgutil

for _found in pkgutil.iter_modules(__path__):
    if _found.ispkg:
        importlib.import_module(f"{__name__}.{_found.name}")
