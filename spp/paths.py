"""Where the framework finds its data: a user's ``data_dir``, ``../shared/data``, or the samples shipped in ``data/``.

Every data set is addressed by the same relative path in all three places (for example
``wikitext2/test.json``), so a full-size copy and the small in-repo sample are interchangeable.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT: Path = Path(__file__).resolve().parents[1]
"""Root of the source checkout (holds ``conf/``, ``data/``, ``train.py``)."""

SAMPLE_DATA_DIR: Path = REPO_ROOT / "data"
"""Small real data shipped with the repository (see ``data/README.md`` for sources and licenses)."""

SHARED_DATA_DIR: Path = REPO_ROOT.parent / "shared" / "data"
"""Optional full-size copies beside the checkout (present on the project's own machines only)."""

CONF_DIR: Path = REPO_ROOT / "conf"


def data_roots(data_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Return the data roots to search, most preferred first.

    Args:
        data_dir: A directory given by the user (config key ``data_dir``). When set it is the only
            full-size root searched; the shipped samples remain the fallback.

    Returns:
        Existing directories: ``data_dir`` (or ``$SPP_DATA_DIR``, or ``../shared/data``), then ``data/``.
    """
    roots: list[Path] = []
    chosen = data_dir or os.environ.get("SPP_DATA_DIR")
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"data_dir={chosen!r} is not a directory; fix the config key data_dir=...")
        roots.append(path.resolve())
    elif SHARED_DATA_DIR.is_dir():
        roots.append(SHARED_DATA_DIR)
    if SAMPLE_DATA_DIR.is_dir() and SAMPLE_DATA_DIR not in roots:
        roots.append(SAMPLE_DATA_DIR)
    return roots


def find_data(relpath: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Resolve a data file or directory by its relative path (e.g. ``"c4/c4_sample.jsonl"``).

    Absolute paths and paths that exist relative to the working directory are returned as they are.

    Raises:
        FileNotFoundError: naming every place that was searched.
    """
    rel = Path(relpath).expanduser()
    if rel.is_absolute() or rel.exists():
        if not rel.exists():
            raise FileNotFoundError(f"data file {str(rel)!r} does not exist")
        return rel.resolve()
    roots = data_roots(data_dir)
    for root in roots:
        candidate = root / rel
        if candidate.exists():
            return candidate
    searched = ", ".join(str(r / rel) for r in roots) or "(no data root exists)"
    raise FileNotFoundError(
        f"data file {str(rel)!r} not found; searched {searched}. Pass data_dir=<dir holding {rel}> or an absolute path."
    )
