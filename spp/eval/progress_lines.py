"""Progress bars as throttled log lines when stderr is a file or a pipe (lm-eval's, and the perplexity's).

lm-eval passes ``disable=False`` to its bars, so ``TQDM_DISABLE`` never reaches them; on a terminal they are left alone.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

LM_EVAL_MODULES = ("lm_eval.models.huggingface", "lm_eval.api.model", "lm_eval.api.task", "lm_eval.evaluator",
                   "lm_eval.api.metrics")
"""The lm-eval modules whose module-level ``tqdm`` draws a bar during ``simple_evaluate``."""

EVERY_S = 30.0
"""Seconds between two lines of one running bar."""


class LineBar:
    """The part of ``tqdm``'s interface lm-eval uses (iterate, ``update``, ``close``, context manager), as log lines.

    Args mirror ``tqdm``'s; ``disable=True`` (lm-eval's ranks other than 0) prints nothing."""

    def __init__(self, iterable: Iterable[Any] | None = None, desc: str | None = None, total: int | float | None = None,
                 disable: bool = False, every_s: float = EVERY_S, **_kwargs: Any) -> None:
        self.iterable = iterable
        self.desc = desc or "lm-eval"
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.disable = disable
        self.every_s = every_s
        self.n = 0
        self._start = self._last = time.perf_counter()
        self._closed = False

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> LineBar:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    def update(self, n: int | float = 1) -> None:
        """Count ``n`` more items; a line when ``every_s`` passed since the last one."""
        self.n += n
        now = time.perf_counter()
        if not self.disable and now - self._last >= self.every_s:
            self._last = now
            log.info("%s: %s in %.0f s", self.desc, self._count(), now - self._start)

    def close(self) -> None:
        """One closing line (``what: n items in s``), once."""
        if self._closed:
            return
        self._closed = True
        if not self.disable and self.n:
            log.info("%s: %s in %.1f s", self.desc, self._count(), time.perf_counter() - self._start)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or self.desc

    def set_postfix(self, *_args: Any, **_kwargs: Any) -> None:
        """Postfixes are a bar's decoration: nothing to log."""

    def refresh(self) -> None:
        """Nothing is drawn."""

    def _count(self) -> str:
        of = f"/{int(self.total)}" if self.total else ""
        return f"{int(self.n)}{of}"


def progress(iterable: Iterable[Any], desc: str, unit: str = "it", every_s: float = EVERY_S,
             disable: bool = False) -> Iterable[Any]:
    """``tqdm(iterable)`` on a terminal; else a :class:`LineBar` (a line every ``every_s`` seconds and at the end;
    ``every_s=0``: a line per item)."""
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=desc, unit=unit, disable=disable)
    return LineBar(iterable, desc=desc, disable=disable, every_s=every_s)


@contextmanager
def lm_eval_bars_as_lines(stream: Any = None) -> Iterator[bool]:
    """Inside the block, lm-eval's bars are :class:`LineBar` when ``stream`` (stderr) is not a terminal; yields
    whether they were swapped."""
    stream = stream if stream is not None else sys.stderr
    if stream.isatty():
        yield False
        return
    saved = []
    for name in LM_EVAL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "tqdm"):
            saved.append((module, module.tqdm))
            module.tqdm = LineBar
    try:
        yield True
    finally:
        for module, original in saved:
            module.tqdm = original
