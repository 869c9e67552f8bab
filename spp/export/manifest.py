"""``spp_export.json``: what a merged model exported by ``train.py`` is. The one schema, written and read here."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from spp.adapters.config import adapter_record as adapter_record  # spp_export.json's "adapter"
from spp.atomic import write_json_atomic

EXPORT_FILE = "spp_export.json"
MANIFEST_FORMAT = 2
"""2: adds ``status``, ``audit`` and ``layout`` to format 1's adapter, dtype and pruning records."""

STATUSES = ("ok", "diverged")


@dataclass
class ExportManifest:
    """The contents of ``spp_export.json``; ``diverged``: the guards refused the run (folder ``merged.diverged``).

    ``audit``'s ``kept_zeros_changed`` = ``kept_zeros_filled`` + ``kept_weights_zeroed``."""

    adapter: dict[str, Any]
    dtype: str
    pruning: dict[str, Any]
    status: str = "ok"
    audit: dict[str, Any] = field(default_factory=dict)
    layout: dict[str, Any] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"spp_export.json status={self.status!r}: must be one of {list(STATUSES)}")

    def torch_dtype(self) -> torch.dtype:
        """:attr:`dtype` as a floating-point ``torch.dtype``; ``ValueError`` when it names none (an empty one)."""
        name = self.dtype.removeprefix("torch.")
        value = getattr(torch, name, None) if name else None
        if not isinstance(value, torch.dtype) or not value.is_floating_point:
            raise ValueError(f"spp_export.json dtype={self.dtype!r} is not a floating-point torch dtype")
        return value

    def write(self, directory: str | Path) -> Path:
        """Write ``<directory>/spp_export.json`` atomically."""
        return write_json_atomic(Path(directory) / EXPORT_FILE, asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExportManifest:
        """From a parsed file, older formats included (format 1 had no status: ``ok``)."""
        return cls(adapter=dict(data.get("adapter") or {}), dtype=str(data.get("dtype", "")),
                   pruning=dict(data.get("pruning") or {}), status=str(data.get("status", "ok")),
                   audit=dict(data.get("audit") or {}), layout=dict(data.get("layout") or {}),
                   format=int(data.get("format", 1)))

    @classmethod
    def read(cls, directory: str | Path | None) -> ExportManifest | None:
        """The manifest of a model folder, or ``None`` when it has none (not an ``spp`` export) or it is unreadable."""
        if not directory:
            return None
        try:
            return cls.from_dict(json.loads((Path(str(directory)).expanduser() / EXPORT_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None

