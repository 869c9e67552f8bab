"""Command-line overrides checked against the command's schema before Hydra composes anything.

Hydra wrongly advises ``+adapter.rr=16`` for a typo; this names the closest valid key. Unsure cases go to Hydra."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import io
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import OmegaConf

from spp.atomic import check_writable_dir
from spp.errors import (
    EXIT_USER_ERROR,
    RENAMED_KEYS,
    UserError,
    field_schema,
    reject_unknown_keys,
    report,
    task_config,
    to_job,
)
from spp.paths import CONF_DIR
from spp.plugins import load_plugins


def config_groups() -> set[str]:
    """Names of the top-level config groups (the folders of ``conf/``, ``hydra`` included)."""
    return {p.name for p in CONF_DIR.iterdir() if p.is_dir()} | {"hydra"}


def parsed_overrides(argv: Sequence[str]) -> list[Override]:
    """The overrides of a command line as Hydra parses them (``[]`` when Hydra's argument or override parser cannot
    read the line: Hydra then reports the problem itself)."""
    try:
        from hydra._internal.utils import get_args_parser
        from hydra.core.override_parser.overrides_parser import OverridesParser

        with contextlib.redirect_stderr(io.StringIO()):  # argparse prints its own errors; Hydra will too
            args, _ = get_args_parser().parse_known_args(list(argv))
        return OverridesParser.create().parse_overrides(list(args.overrides or []))
    except (Exception, SystemExit):  # noqa: BLE001 - any parse problem is Hydra's to report, in its own words
        return []


def plain_keys(overrides: Sequence[Override]) -> list[str]:
    """The keys of the plain ``key=value`` overrides among ``overrides`` (not ``+``/``++``/``~``, no ``@package``)."""
    return [o.key_or_group for o in overrides if o.type == OverrideType.CHANGE and not o.package]


def _schema_error(parts: Sequence[str], schema: type, prefix: str = "") -> UserError | None:
    """:func:`spp.errors.reject_unknown_keys` for the one dotted key ``parts`` below ``schema``."""
    tree = functools.reduce(lambda inner, part: {part: inner}, reversed(parts), None)
    try:
        reject_unknown_keys(OmegaConf.create(tree), schema, prefix=prefix)
    except UserError as err:
        return err
    return None


def unknown_override(keys: Sequence[str], schema: type, config_name: str,
                     overrides: Sequence[Override]) -> UserError | None:
    """The :class:`UserError` for the first key no field of ``schema`` declares, else ``None``; a key under a group
    option with its own schema is judged by :func:`option_key_error`."""
    groups = config_groups()
    fields = {f.name for f in dataclasses.fields(schema)}
    for key in keys:
        parts = key.split(".")
        if "/" in key or (parts[0] in groups and len(parts) == 1) or parts[0] == "hydra" or not all(parts):
            continue
        err = _schema_error(parts, schema)  # an untyped key passes when any option's schema declares it
        nested = len(parts) > 1 and field_schema(schema, parts[0]) is not None
        if nested and (err is not None or group_schemas(parts[0])):  # so a group of typed options asks the chosen one
            err = option_key_error(config_name, parts[0], parts[1:], overrides)
        elif len(parts) == 1 and err is not None and key not in RENAMED_KEYS:  # or a misspelled group (experimnt=x)
            names = set(fields) | groups - {"hydra"}
            close = difflib.get_close_matches(key, sorted(names), n=1)
            if close:
                return UserError(err.what, f"remove it; did you mean {close[0]}=?", key=key)
        if err is not None:
            return err
    return None


def group_options(group: str) -> list[str]:
    """The user-facing options of config group ``group`` as Hydra finds them (``conf/``, search-path plug-ins, the
    ConfigStore), without the internal ``<name>_schema`` entries that type them."""
    return [name for name in _loader().get_group_options(group) if not name.endswith("_schema")]


def _loader() -> Any:
    """Hydra's config loader over ``conf/`` and the search-path plug-ins."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    return ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF_DIR)))


def unknown_option(overrides: Sequence[Override]) -> UserError | None:
    """The one-line :class:`UserError` for the first group selection (``pruner=sparsgpt``) naming no option of its
    group, listing the options (Hydra's own error is multi-line and lists the internal ``*_schema`` entries)."""
    if any(o.key_or_group.startswith("hydra.searchpath") for o in overrides):
        return None  # options from other config folders: Hydra judges them itself
    groups = config_groups() - {"hydra"}
    for o in overrides:
        if o.type not in (OverrideType.CHANGE, OverrideType.ADD) or o.package or o.key_or_group not in groups:
            continue
        raw = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
        values = [str(v) for item in raw for v in (item if isinstance(item, list) else [item]) if v is not None]
        options = group_options(o.key_or_group)
        for value in values:
            if value in options or value == "null" or not options:
                continue
            close = difflib.get_close_matches(value, options, n=1)
            hint = f"did you mean {o.key_or_group}={close[0]}? " if close else ""
            return UserError(f"{o.key_or_group}={value} is not an option of {o.key_or_group}",
                             f"{hint}choose one of: {', '.join(options)}", key=o.key_or_group)
    return None


def run_dir_error(argv: Sequence[str], overrides: Sequence[Override]) -> UserError | None:
    """On a single run, a ``run_dir=`` that cannot be written: one line naming it, before Hydra creates its run
    directory there (``hydra.run.dir`` follows ``run_dir``; Hydra's own failure is a traceback)."""
    if "-m" in argv or "--multirun" in argv:
        return None
    given = [o for o in overrides if o.key_or_group == "run_dir" and o.type == OverrideType.CHANGE
             and not o.is_sweep_override() and o.value() not in (None, "")]
    if not given or any(o.key_or_group == "hydra.run.dir" for o in overrides):
        return None
    try:
        check_writable_dir(str(given[-1].value()), "run_dir")
    except UserError as err:
        return err
    return None


def sweep_job_error(argv: Sequence[str], overrides: Sequence[Override], schema: type,
                    config_name: str) -> UserError | None:
    """In a multirun under Hydra's basic sweeper and launcher, the first job whose typed config is refused (a
    ``__post_init__`` check), before any job runs: that launcher runs the jobs one after another and each converts
    its config only when it starts, so job N would fail after jobs 0..N-1 trained. What does not compose is Hydra's."""
    if "-m" not in argv and "--multirun" not in argv:
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.types import RunMode

    try:
        jobs, loader = BasicSweeper.split_arguments(list(overrides), None)[0], _loader()
        for num, job in enumerate(jobs):
            with contextlib.redirect_stderr(io.StringIO()):
                cfg = loader.load_configuration(config_name, job, run_mode=RunMode.MULTIRUN)
            if not all(".core_plugins.basic_" in str(cfg.hydra[k]._target_) for k in ("sweeper", "launcher")):
                return None  # Optuna asks for its trials as it goes; submitit starts every job at once
            try:
                to_job(task_config(cfg), schema)
            except UserError as err:
                named = " ".join(o for o in job if not o.startswith("hydra"))
                return UserError(f"sweep job {num} ({named}): {err.what}", err.fix, key=err.key)
    except Exception:  # noqa: BLE001 - a sweep that does not compose is Hydra's to report, in its own words
        return None
    return None


def option_key_error(config_name: str, group: str, rest: Sequence[str],
                     overrides: Sequence[Override] = ()) -> UserError | None:
    """The error for the first chosen option of ``group`` whose schema lacks ``<group>.<rest>``, else ``None``."""
    for option, own in chosen_options(config_name, group, overrides) or []:
        err = _schema_error(rest, own, prefix=f"{group}.")
        if err is None:
            continue
        mine = [f.name for f in dataclasses.fields(own)]
        if difflib.get_close_matches(rest[0], mine, n=1):
            return err  # a misspelling: "did you mean <group>.<key>=?"
        theirs = {name: [f.name for f in dataclasses.fields(schema)] for name, schema in group_schemas(group).items()}
        others = [name for name, keys in theirs.items() if rest[0] in keys]
        close = [(k, name) for name, keys in theirs.items() for k in difflib.get_close_matches(rest[0], keys, n=1)]
        if not others and not close:
            return err
        key = f"{group}.{rest[0]}"
        fix = (f"remove {key}, or choose {' / '.join(f'{group}={o}' for o in others)}, which "
               f"{'has' if len(others) == 1 else 'have'} it" if others
               else f"remove it; did you mean {group}.{close[0][0]} (a key of {group}={close[0][1]})?")
        return UserError(f"{group}={option} has no key {key} (its keys: {', '.join(mine)})", fix, key=key)
    return None


def group_schemas(group: str) -> dict[str, type]:
    """The schemas the options of ``group`` may be typed by: ConfigStore's ``<group>/<name>_schema`` entries
    (``register_pruner`` stores them), as ``{name: dataclass}``."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    found: dict[str, type] = {}
    for entry in store.list(group) if group in store.repo else []:
        name = entry.removesuffix(".yaml")
        schema = OmegaConf.get_type(store.load(f"{group}/{entry}").node)
        if name.endswith("_schema") and isinstance(schema, type) and dataclasses.is_dataclass(schema):
            found[name.removesuffix("_schema")] = schema
    return found


def chosen_options(config_name: str, group: str, overrides: Sequence[Override]) -> list[tuple[str, type]] | None:
    """``(option, schema)`` for each option of ``group`` the command line chooses, each composed (group selections
    only, other sweeps at their first value) to read the type of its node; ``None`` when one does not compose."""
    from hydra.types import RunMode

    selections = [o for o in overrides if "." not in o.key_or_group and o.key_or_group != "hydra"]
    mine = next((o for o in selections if o.key_or_group == group), None)
    values = list(mine.sweep_string_iterator()) if mine is not None and mine.is_sweep_override() else [None]
    out = []
    try:
        loader = _loader()
        for value in values:
            lines = [_first_value(o, value if o is mine else None) for o in selections]
            with contextlib.redirect_stderr(io.StringIO()):
                cfg = loader.load_configuration(config_name, lines, run_mode=RunMode.RUN)
            out.append((str(cfg.hydra.runtime.choices.get(group)), OmegaConf.get_type(cfg, group)))
    except Exception:  # noqa: BLE001 - an option that does not compose is Hydra's to report
        return None
    return out


def _first_value(override: Override, value: str | None) -> str:
    """The override as one command-line item, with ``value`` (or a sweep's first value) as its value."""
    prefix = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++", OverrideType.DEL: "~"}.get(override.type, "")
    if value is None:
        value = (next(iter(override.sweep_string_iterator())) if override.is_sweep_override()
                 else override.get_value_element_as_str())
    return f"{prefix}{override.get_key_element()}={value}"


def checked_overrides(cmd: str, schema: type, config_name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate the ``@hydra.main`` function of primary config ``config_name``: unknown plain keys of ``sys.argv``
    exit 2 with one line (plug-ins loaded first; a ``cfg_passthrough`` call passes unchecked)."""

    def decorate(hydra_main: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(hydra_main)
        def main(*args: Any, **kwargs: Any) -> Any:
            try:  # a user's plug-ins register their methods and schemas before Hydra composes (spp.plugins)
                load_plugins()
            except UserError as err:
                report(cmd, err)
                raise SystemExit(EXIT_USER_ERROR) from None
            if not args and not kwargs:
                overrides = parsed_overrides(sys.argv[1:])
                other_conf = any(a.startswith(("--config-dir", "-cd")) for a in sys.argv[1:])  # more options
                err = (None if other_conf else unknown_option(overrides)) or unknown_override(
                    plain_keys(overrides), schema, config_name, overrides) or run_dir_error(sys.argv[1:], overrides) \
                    or (None if other_conf else sweep_job_error(sys.argv[1:], overrides, schema, config_name))
                if err is not None:
                    report(cmd, err)
                    raise SystemExit(EXIT_USER_ERROR)
            return hydra_main(*args, **kwargs)

        return main

    return decorate
