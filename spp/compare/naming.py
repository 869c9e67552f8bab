"""Plain names for a sweep's job folders (``${spp_sweep_name:...}`` in ``conf/shared.yaml``'s ``hydra.sweep.subdir``).

Hydra's ``override_dirname`` keeps ``[``, ``]``, ``,`` and ``=`` (shell globs break ``wandb sync <folder>``);
names here are ``<job>_<key>-<value>...`` in ``[A-Za-z0-9._+-]``, cut past :data:`MAX_NAME` with a hash of the whole.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from omegaconf import OmegaConf

RESOLVER = "spp_sweep_name"
MAX_NAME = 120
_LIST = str.maketrans({",": "+", "[": None, "]": None, "{": None, "}": None, "'": None, '"': None, " ": None})
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def _plain(text: str) -> str:
    """``[csv,wandb]`` → ``csv+wandb``; ``a/b=c:d`` → ``a-b-c-d``."""
    return _UNSAFE.sub("-", text.translate(_LIST)).strip("-")


def sweep_job_name(num: int | str, overrides: Iterable[str], exclude: Iterable[str] = ()) -> str:
    """The folder name of sweep job ``num`` run with the command line ``overrides`` (Hydra's ``task`` list), less
    the ``exclude`` keys: ``3_adapter.r-8_sparsity-nm2_4``; ``3`` when every override is excluded."""
    skip = set(exclude)
    items = []
    for override in sorted((str(o) for o in overrides), key=lambda o: o.lstrip("+~")):
        key, sep, value = override.partition("=")
        key = key.lstrip("+~")
        if key in skip or key.startswith("hydra."):
            continue
        items.append(_plain(key) + ("-" + (_plain(value) or "none") if sep else "-deleted"))
    name = "_".join([str(num), *items])
    if len(name) > MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = name[: MAX_NAME - 9].rstrip("_-.") + "_" + digest
    return name


def register_sweep_name() -> None:
    """Register the ``spp_sweep_name`` resolver (idempotent); every command does before Hydra composes."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, lambda num, task, exclude=(): sweep_job_name(num, task, exclude))
