"""Where the framework finds its data: a user's ``data_dir``, ``../shared/data``, or the samples shipped in ``data/``;
one relative path (``wikitext2/test.json``) addresses a data set in all three."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

REPO_ROOT: Path = Path(__file__).resolve().parents[1]
"""Root of the source checkout (holds ``conf/``, ``data/``, ``train.py``)."""

SAMPLE_DATA_DIR: Path = REPO_ROOT / "data"
"""Small real data shipped with the repository (see ``data/README.md`` for sources and licenses)."""

SHARED_DATA_DIR: Path = REPO_ROOT.parent / "shared" / "data"
"""Optional full-size copies beside the checkout (present on the project's own machines only)."""

CONF_DIR: Path = REPO_ROOT / "conf"
"""The Hydra config directory of the commands (``config_path``)."""

CACHE_DIR_ENV = "SPP_CACHE_DIR"
"""The environment variable that moves the default cache root (pruning and perplexity caches)."""

CACHE_DIR_CONFIG = "${oc.env:SPP_CACHE_DIR,${oc.env:HOME}/.cache/spp}"
"""The ``cache_dir`` config default: :func:`default_cache_dir` as an OmegaConf interpolation."""

TRUNCATED_SAMPLES: tuple[str, ...] = (
    "boolq/val.jsonl",
    "hellaswag/hellaswag_val_full.txt",
    "winogrande/winogrande.jsonl",
    "arc/",
    "mmlu/test/",
)
"""Files (or folders, ending in ``/``) of ``data/`` that are truncated copies (``data/README.md`` says which)."""

_READ: dict[str, tuple[Path, Path | None]] = {}
_SHA256: dict[tuple[str, int, float], str] = {}


def data_roots(data_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Existing data roots, most preferred first: ``data_dir`` alone when given (no silent fall-back to the shipped
    full-size data), else ``$SPP_DATA_DIR`` or ``../shared/data``; then the shipped ``data/`` samples."""
    roots: list[Path] = []
    chosen = data_dir or os.environ.get("SPP_DATA_DIR")
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_dir():
            key = "data_dir" if data_dir else "SPP_DATA_DIR"
            where = "config key data_dir=..." if data_dir else "environment variable SPP_DATA_DIR"
            raise FileNotFoundError(f"{key}={str(chosen)!r} is not a directory; fix the {where}")
        roots.append(path.resolve())
        if data_dir:
            return roots
    elif SHARED_DATA_DIR.is_dir():
        roots.append(SHARED_DATA_DIR)
    if SAMPLE_DATA_DIR.is_dir() and SAMPLE_DATA_DIR not in roots:
        roots.append(SAMPLE_DATA_DIR)
    return roots


def find_data(relpath: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Resolve a data path (``"c4/c4_sample.jsonl"``) under :func:`data_roots`; absolute or cwd-relative paths as they
    are. ``FileNotFoundError`` names every place searched."""
    rel = Path(relpath).expanduser()
    if rel.is_absolute() or rel.exists():
        if not rel.exists():
            raise FileNotFoundError(f"data file {str(rel)!r} does not exist")
        return _record(rel.resolve(), None)
    roots = data_roots(data_dir)
    for root in roots:
        candidate = root / rel
        if candidate.exists():
            return _record(candidate, root)
    searched = ", ".join(str(r / rel) for r in roots) or "(no data root exists)"
    raise FileNotFoundError(
        f"data file {str(rel)!r} not found; searched {searched}. Pass data_dir=<dir holding {rel}> or an absolute path."
    )


def _record(path: Path, root: Path | None) -> Path:
    """Remember a data file or folder that a job resolved, and the data root it was found under (for
    :func:`data_provenance`)."""
    _READ[str(path)] = (path, root)
    return path


def relative_data_path(file: Path, root: Path | None = None) -> tuple[str, str]:
    """``(where, path)`` of a data file for a run record, never an absolute path: ``repo`` or ``data_root`` and the
    path relative to it, else ``external`` and the file's name."""
    resolved = file.resolve()
    if resolved.is_relative_to(REPO_ROOT):
        return "repo", resolved.relative_to(REPO_ROOT).as_posix()
    if root is not None and file.is_relative_to(root):
        return "data_root", file.relative_to(root).as_posix()
    if root is not None and resolved.is_relative_to(root.resolve()):
        return "data_root", resolved.relative_to(root.resolve()).as_posix()
    return "external", file.name


def shipped_copy(where: str, rel: str) -> Path | None:
    """The shipped sample at the same relative path as a recorded file (``None`` when there is none)."""
    if where == "external":
        return None
    sample = (REPO_ROOT / rel if where == "repo" else SAMPLE_DATA_DIR / rel).resolve()
    return sample if sample.is_file() and sample.is_relative_to(SAMPLE_DATA_DIR) else None


def is_truncated_sample(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is one of the truncated sample files shipped in ``data/``."""
    path = Path(path).resolve()
    if not path.is_relative_to(SAMPLE_DATA_DIR):
        return False
    rel = path.relative_to(SAMPLE_DATA_DIR).as_posix()
    return any(rel == t or (t.endswith("/") and rel.startswith(t)) for t in TRUNCATED_SAMPLES)


def file_sha256(path: str | os.PathLike[str], *, memo: bool = False) -> str:
    """Hex sha256 of a file, read in 16 MiB chunks; ``memo=True`` remembers it by path, size and modification time
    (the data files hashed again for each record; checksums that must catch an altered file are never memoised)."""
    stat = Path(path).stat()
    key = (str(path), stat.st_size, stat.st_mtime)
    if memo and key in _SHA256:
        return _SHA256[key]
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(1 << 24):
            digest.update(block)
    _SHA256[key] = digest.hexdigest()
    return _SHA256[key]


def json_sha256(value: Any) -> str:
    """Hex sha256 of ``value`` as sorted-key JSON (non-JSON values via ``str``): the digest of a cache key."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def read_json_records(path: str | os.PathLike[str],
                      fix: str = "point data.source at a valid JSON array / JSON-lines file") -> list[Any]:
    """Parse a JSON array or JSON-lines file (by its first non-blank character); errors name file, line and column
    (``fix``: what to do about an invalid array, after "Fix the file or ")."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}: invalid JSON at line {err.lineno}, column {err.colno} (char {err.pos}): {err.msg}. "
                f"Fix the file or {fix}."
            ) from err
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON array of records, got {type(data).__name__}")
        return data
    rows: list[Any] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}: invalid JSON at line {lineno}, column {err.colno}: {err.msg}. The file is read as "
                "JSON lines (one object per line) because it does not start with '['; fix that line."
            ) from err
    return rows


def forget_data_reads() -> None:
    """Start a new job's record of the data files it reads."""
    _READ.clear()


def _provenance_row(file: Path, root: Path | None) -> dict[str, Any]:
    """One file's record: where (``repo``, ``data_root``, ``external``), its relative path, sha256, size, and
    whether its bytes are the shipped sample at the same relative path (and that sample a truncated one)."""
    where, rel = relative_data_path(file, root)
    sha = file_sha256(file, memo=True)
    sample = shipped_copy(where, rel)
    shipped = sample is not None and file_sha256(sample, memo=True) == sha
    return {"path": rel, "root": where, "sha256": sha, "bytes": file.stat().st_size, "shipped_sample": shipped,
            "truncated_sample": shipped and is_truncated_sample(sample)}


def data_provenance() -> list[dict[str, Any]]:
    """Every data file resolved by :func:`find_data` (folders file by file): path relative to the repo or data root,
    sha256, size, and whether it is the shipped (or truncated) sample."""
    files: dict[str, tuple[Path, Path | None]] = {}
    for path, root in _READ.values():
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file() and not file.name.startswith(("LICENSE", ".")):
                files[str(file)] = (file, root)
    return sorted((_provenance_row(file, root) for file, root in files.values()), key=lambda r: (r["root"], r["path"]))


def default_cache_dir() -> Path:
    """``$SPP_CACHE_DIR``, else ``~/.cache/spp``: the cache root when no ``cache_dir`` is given."""
    return Path(os.environ.get(CACHE_DIR_ENV, Path.home() / ".cache" / "spp"))
