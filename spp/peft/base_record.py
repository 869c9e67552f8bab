"""The base an adapter folder records (:mod:`spp.adapters.trained_on`), carried by spp's peft configs and checked
when peft injects the adapter (``PeftModel.from_pretrained``, ``load_adapter``).

A config read from a folder (:func:`from_folder`) holds the folder's record in its ``spp_trained_on`` field (``{}``
when the folder records none); a config made in code holds ``None`` and nothing is checked. The tuners call
:func:`check` on the plain base model before they replace any layer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from peft.config import PeftConfig
from torch import nn

from spp.adapters.registry import check_adapter_files, trained_on
from spp.adapters.trained_on import check_base

C = TypeVar("C", bound=PeftConfig)

SOURCE_ATTR = "_spp_source"
"""Where a config was read from (not a dataclass field: never saved), for the refusal's wording."""


def from_folder(load: Callable[[], C], path: str | os.PathLike, subfolder: str | None = None) -> C:
    """``load()`` (peft's ``from_pretrained``) after checking a local folder's files (a truncated JSON or
    safetensors file is one line naming it), with the folder's record in ``spp_trained_on``."""
    local = Path(path, subfolder or "").expanduser()
    if local.is_dir():
        check_adapter_files(local, key="adapter folder")
    config = load()
    if local.is_dir():
        if getattr(config, "spp_trained_on", None) is None:
            config.spp_trained_on = trained_on(local) or {}
        setattr(config, SOURCE_ATTR, str(local))
    return config


def check(config: PeftConfig, model: nn.Module) -> None:
    """Refuse ``model`` when it is not the base ``config``'s folder records (warn when the folder records none);
    nothing for a config made in code."""
    record: dict[str, Any] | None = getattr(config, "spp_trained_on", None)
    if record is None:
        return
    source = getattr(config, SOURCE_ATTR, None)
    what = f"the adapter folder {source!r}" if source else "this adapter"
    check_base(record or None, model, what, key="adapter folder", path=source)
