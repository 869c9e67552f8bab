"""Command-line overrides checked against the command's schema before Hydra composes anything.

Hydra answers an unknown key given without ``+`` (``adapter.rr=16``) with its own composition error, which
advises ``+adapter.rr=16``: wrong, the key does not exist. :func:`checked_overrides` wraps a command's
``@hydra.main`` function and, before Hydra runs, rejects such a key with the message the project gives for
``+adapter.rr=16`` (:func:`spp.errors.reject_unknown_keys`: the key and the closest valid one), as one line and
exit status 2. Everything it is not sure about (config groups, ``hydra.*``, ``+``/``++``/``~`` overrides, keys
below ``Any``/``dict`` fields, unparsable arguments) is left to Hydra and to the check after composition.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import io
import sys
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import OmegaConf

from spp.errors import EXIT_USER_ERROR, UserError, reject_unknown_keys, report
from spp.paths import CONF_DIR
from spp.plugins import load_plugins


def config_groups() -> set[str]:
    """Names of the top-level config groups (the folders of ``conf/``, ``hydra`` included)."""
    return {p.name for p in CONF_DIR.iterdir() if p.is_dir()} | {"hydra"}


def plain_override_keys(argv: Sequence[str]) -> list[str]:
    """The keys of the plain ``key=value`` overrides in a command line (not ``+``/``++``/``~``, no ``@package``).

    Hydra's own argument parser separates its flags (``-m``, ``--cfg job``, ``-cp``, ...) from the overrides and its
    override parser reads them (sweeps such as ``a=1,2`` included). Returns ``[]`` when either cannot parse the
    line: Hydra then reports the problem itself.
    """
    try:
        from hydra._internal.utils import get_args_parser
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.core.override_parser.types import OverrideType

        with contextlib.redirect_stderr(io.StringIO()):  # argparse prints its own errors; Hydra will too
            args, _ = get_args_parser().parse_known_args(list(argv))
        overrides = OverridesParser.create().parse_overrides(list(args.overrides or []))
    except (Exception, SystemExit):  # noqa: BLE001 - any parse problem is Hydra's to report, in its own words
        return []
    return [o.key_or_group for o in overrides if o.type == OverrideType.CHANGE and not o.package]


def unknown_override(keys: Sequence[str], schema: type) -> UserError | None:
    """The :class:`UserError` for the first key that no field of ``schema`` declares, else ``None``.

    A key naming a config group (``model=tiny``, ``hydra/launcher=local``) or under ``hydra.`` is skipped.
    """
    groups = config_groups()
    for key in keys:
        parts = key.split(".")
        if "/" in key or (parts[0] in groups and len(parts) == 1) or parts[0] == "hydra" or not all(parts):
            continue
        tree: dict[str, Any] = {}
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = None
        try:
            reject_unknown_keys(OmegaConf.create(tree), schema)
        except UserError as err:
            if len(parts) == 1:  # a top-level key may also be a misspelled group (experimnt=tiny_smoke)
                names = {f.name for f in dataclasses.fields(schema)} | groups - {"hydra"}
                close = difflib.get_close_matches(key, sorted(names), n=1)
                if close:
                    return UserError(err.what, f"remove it; did you mean {close[0]}=?", key=key)
            return err
    return None


def checked_overrides(cmd: str, schema: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a ``@hydra.main`` function: unknown plain keys of ``sys.argv`` exit 2 with one line first.

    Use it above ``@hydra.main`` (``cmd`` is the script name the message starts with, ``schema`` the command's
    typed job). A call with a config (Hydra's ``cfg_passthrough``) is passed through unchecked. The plug-ins of
    ``SPP_PLUGINS`` are imported first (:func:`spp.plugins.load_plugins`), so their options compose.
    """

    def decorate(hydra_main: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(hydra_main)
        def main(*args: Any, **kwargs: Any) -> Any:
            try:  # a user's plug-ins register their methods and schemas before Hydra composes (spp.plugins)
                load_plugins()
            except UserError as err:
                report(cmd, err)
                raise SystemExit(EXIT_USER_ERROR) from None
            if not args and not kwargs:
                err = unknown_override(plain_override_keys(sys.argv[1:]), schema)
                if err is not None:
                    report(cmd, err)
                    raise SystemExit(EXIT_USER_ERROR)
            return hydra_main(*args, **kwargs)

        return main

    return decorate
