"""How large a transient m x n buffer an adapter's forward or backward may build at once (shared by the methods)."""

from __future__ import annotations

BACKWARD_CHUNK_ELEMENTS = 1 << 24
"""Largest transient buffer (elements) a chunked backward builds per chunk of rows: 2**24 fp32 = 64 MiB."""

MAX_DELTA_ELEMENTS = 1 << 27
"""Largest transient m x n product built in one piece (2**27: every projection of LLaMA-7B..30B, the fast GPU path)."""


def row_chunks(m: int, n: int, whole: int = MAX_DELTA_ELEMENTS, chunk: int = BACKWARD_CHUNK_ELEMENTS
               ) -> list[tuple[int, int]]:
    """Row ranges of an m x n matrix: one range when ``m * n <= whole``, else ranges of at most ``chunk`` elements."""
    if m * n <= whole:
        return [(0, m)]
    rows = max(1, chunk // max(n, 1))
    return [(lo, min(lo + rows, m)) for lo in range(0, m, rows)]
