"""Text shared by the reports: Markdown table lines, a perplexity with its interval, nested keys as dotted names (no
heavy imports)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def markdown_lines(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """Markdown table lines: the first ``left`` columns left-aligned, the rest right-aligned."""
    align = ["---"] * left + ["---:"] * (len(head) - left)
    return ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def interval_text(low: float | None, high: float | None) -> str:
    """`` [29.80, 31.50]``, or ``""`` without both ends of the interval."""
    return f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""


def ppl_with_interval(entry: dict[str, Any] | None) -> str:
    """``30.64``, or ``30.64 [29.80, 31.50]`` when the entry carries an interval (``ci_low`` / ``ci_high``)."""
    return f"{entry['ppl']:.2f}{interval_text(entry.get('ci_low'), entry.get('ci_high'))}" if entry else "-"


def dotted_keys(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (lists kept as values; a leaf ``value`` is ``{prefix: value}``)."""
    if not isinstance(value, dict):
        return {prefix: value}
    return {key: leaf for k, v in value.items()
            for key, leaf in dotted_keys(v, f"{prefix}.{k}" if prefix else str(k)).items()}
