"""One error surface for the commands (``docs/errors.md``): :class:`UserError` says what is wrong and how to fix it;
:func:`cli_errors` prints it as one ``<script>: error: ...`` line, exit status 2. A bug keeps its traceback."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import re
import struct
import sys
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

EXIT_USER_ERROR = 2
"""Exit status of a run stopped by a :class:`UserError` (Hydra's own composition errors exit 1)."""

_KEY = re.compile(r"(?<![\w./-])((?:[a-z_][a-z0-9_]*\.)*[a-z_][a-z0-9_]*)=")
"""A config key written as ``key=`` or ``group.key=`` in a message (how the project's own errors name keys)."""

_LEADING_KEY = re.compile(r"([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)\b(?!\.)")
"""A message that starts with a dotted config key (``data.max_length must be >= 2``)."""


RENAMED_KEYS: dict[str, str] = {
    "output_dir": "the output folder of every command is run_dir=<folder>",
    "output_file": "generate.py writes generation.json into run_dir=<folder>",
}
"""Top-level keys that no command takes any more, with what replaced them (refused in one line naming it)."""


class UserError(ValueError):
    """An error the user can fix: ``what`` is wrong, ``fix`` says how; ``key`` / ``path`` name the culprit."""

    def __init__(self, what: str, fix: str, *, key: str | None = None, path: str | os.PathLike[str] | None = None):
        self.what = _one_line(what)
        self.fix = _one_line(fix)
        self.key = key
        self.path = str(path) if path is not None else None
        super().__init__(f"{self.what} — {self.fix}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle with every field (an error of rank 0 is broadcast to the other ranks, which raise it too)."""
        return functools.partial(type(self), key=self.key, path=self.path), (self.what, self.fix)

    @classmethod
    def from_message(cls, message: str, fix: str | None = None) -> UserError:
        """Split a project message ``"<what>; <fix>"`` (or name its key in a generic fix when there is none)."""
        message = _one_line(message)
        if fix is None and "; " in message:
            what, _, fix = message.rpartition("; ")
        else:
            what = message
        match = _KEY.search(message) or _LEADING_KEY.match(message)
        key = match.group(1) if match else None
        if not fix:
            fix = f"change {key} (see docs/errors.md)" if key else "fix the input named above (see docs/errors.md)"
        return cls(what, fix, key=key)


class DivergedError(UserError):
    """A guard refused a run's result (non-finite loss, merged perplexity far worse than the pruned model)."""


class RankFailureError(UserError):
    """A rank of a distributed job died, stopped or hung; the survivors name it in one line (``spp.rank_watch``)."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def exception_chain(exc: BaseException, context: bool = True) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (``__cause__``, else with ``context`` ``__context__``), once each."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (current.__context__ if context else None)


@contextmanager
def user_file(path: str | os.PathLike[str], key: str, fix: str | None = None) -> Iterator[None]:
    """Turn a library's error while reading the user's file ``path`` (set by config ``key``) into a UserError: a
    damaged safetensors, JSON or GGUF (``struct``) file, bad text, a file cut short, an OS error."""
    from safetensors import SafetensorError  # a transformers dependency, imported when a file is read

    try:
        yield
    except UserError:
        raise
    except (struct.error, EOFError, SafetensorError, OSError, ValueError) as err:  # JSON and text errors: ValueError
        raise UserError(
            f"{key}: cannot read {path}: {type(err).__name__}: {err}",
            fix or f"check that the file is complete and of the right format, or point {key}= at a good copy",
            key=key, path=path,
        ) from err


_TRANSLATORS: list[typing.Callable[[BaseException], UserError | None]] = []
"""Turn a library's exception into the user's error (:func:`register_error_translator`); tried in order."""


def register_error_translator(translate: typing.Callable[[BaseException], UserError | None]) -> None:
    """Let :func:`as_user_error` ask ``translate`` about an exception that is not a UserError (``None``: not its
    kind). ``spp.rank_watch`` registers the collective failures of a distributed job this way."""
    if translate not in _TRANSLATORS:
        _TRANSLATORS.append(translate)


def as_user_error(exc: BaseException) -> UserError | None:
    """The :class:`UserError` behind ``exc`` (in its cause chain, a ``FileNotFoundError`` naming a config key, or a
    registered translator's), or ``None`` for an internal error."""
    found = next((e for e in exception_chain(exc, context=False) if isinstance(e, UserError)), None)
    if found is not None:
        return found
    if isinstance(exc, FileNotFoundError) and _KEY.search(str(exc)):
        return UserError.from_message(str(exc))
    for translate in _TRANSLATORS:
        try:
            err = translate(exc)
        except Exception:  # noqa: BLE001 - a translator's own failure must not hide the original error
            err = None
        if err is not None:
            return err
    return None


def report(cmd: str, err: UserError) -> None:
    """Print ``<cmd>: error: <what> — <fix>`` as one line on stderr."""
    print(f"{cmd}: error: {err}", file=sys.stderr, flush=True)


@contextmanager
def cli_errors(cmd: str) -> Iterator[None]:
    """Inside a command's main function: a :class:`UserError` becomes one stderr line and exit status 2."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is the user's error
        err = as_user_error(exc)
        if err is None:
            raise
        report(cmd, err)
        raise SystemExit(EXIT_USER_ERROR) from None


@contextmanager
def user_errors(*kinds: type[BaseException], prefix: str = "") -> Iterator[None]:
    """Inside: a ``kinds`` error becomes one :class:`UserError` line (:meth:`UserError.from_message` of ``prefix`` and
    its message; an OmegaConf error's first line); a :class:`UserError` passes as it is, never wrapped twice."""
    try:
        yield
    except UserError:
        raise
    except kinds as err:
        message = str(err).split("\n")[0] if isinstance(err, OmegaConfBaseException) else str(err)
        raise UserError.from_message(prefix + message) from err


def task_config(cfg: DictConfig) -> DictConfig:
    """``cfg`` without its ``hydra`` node, as Hydra hands it to the task function."""
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        task.pop("hydra", None)
    return task


def to_job(cfg: DictConfig, schema: type) -> Any:
    """Convert a composed config once into its typed job; an unknown key, a ``__post_init__`` ``ValueError`` or an
    OmegaConf validation error becomes a :class:`UserError` naming the key."""
    reject_unknown_keys(cfg, schema)
    with user_errors(ValueError, OmegaConfBaseException):
        return OmegaConf.to_object(cfg)


def reject_unknown_keys(cfg: DictConfig, schema: type, prefix: str = "") -> None:
    """Raise UserError for a key of ``cfg`` no field of ``schema`` declares (``+key=value`` would set a stray
    attribute nothing reads); ``Any`` and ``dict`` fields take any key."""
    fields = {f.name for f in dataclasses.fields(schema)}
    for key in cfg.keys():
        name = f"{prefix}{key}"
        if key not in fields and not prefix and key in RENAMED_KEYS:
            raise UserError(f"{key}= is not a key any more: {RENAMED_KEYS[str(key)]}", f"write run_dir= instead of "
                            f"{key}=", key=str(key))
        if key not in fields:
            close = difflib.get_close_matches(str(key), sorted(fields), n=1)
            hint = f"did you mean {prefix}{close[0]}=?" if close else f"valid keys: {', '.join(sorted(fields))}"
            raise UserError(f"unknown config key {name} (also when added with +)", f"remove it; {hint}", key=name)
        sub = field_schema(schema, str(key))
        if sub is not None and isinstance(cfg._get_node(key), DictConfig):
            node = cfg._get_node(key)
            if not node._is_none() and not node._is_missing():
                _reject_in_node(node, sub, prefix=f"{name}.")


def field_schema(cls: type, name: str) -> type | None:
    """The dataclass type of field ``name`` of ``cls`` (``None``: no such field, or not a dataclass)."""
    hint = typing.get_type_hints(cls).get(name)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def dataclass_subclasses(cls: type) -> list[type]:
    """Every dataclass deriving from ``cls``, depth first."""
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *dataclass_subclasses(sub)] if dataclasses.is_dataclass(sub) else dataclass_subclasses(sub)
    return out


def _reject_in_node(node: DictConfig, declared: type, prefix: str) -> None:
    """:func:`reject_unknown_keys` for a node declared ``declared``: a typed node by its own type (a group option's
    subclass), an untyped one against the declared schema or any subclass."""
    actual = OmegaConf.get_type(node)
    if isinstance(actual, type) and dataclasses.is_dataclass(actual) and issubclass(actual, declared):
        reject_unknown_keys(node, actual, prefix=prefix)
        return
    errors = []
    for candidate in [declared, *dataclass_subclasses(declared)]:
        try:
            reject_unknown_keys(node, candidate, prefix=prefix)
            return
        except UserError as err:
            errors.append(err)
    raise next((e for e in errors if "did you mean" in e.fix), errors[0])

