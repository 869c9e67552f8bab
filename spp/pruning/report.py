"""The pruning report: per-layer and overall exact-zero sparsity, N:M validity and wall time per phase."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spp.pruning.config import SparsityConfig


@dataclass
class PruneReport:
    """Per-layer rows (name, shape, sparsity, N:M audit, seconds, pruner extras) and overall totals."""

    layers: list[dict[str, Any]] = field(default_factory=list)
    overall: dict[str, Any] = field(default_factory=dict)

    def to_markdown(self) -> str:
        """A Markdown table: one row per layer, then the overall line."""
        lines = ["| layer | shape | sparsity | N:M valid | seconds |", "|---|---|---|---|---|"]
        for row in self.layers:
            nm = "-" if row.get("nm_valid") is None else ("yes" if row["nm_valid"] else f"NO ({row['nm_violations']})")
            lines.append(
                f"| {row['name']} | {'x'.join(map(str, row['shape']))} | {row['sparsity']:.4f} | {nm} | "
                f"{row.get('seconds', 0.0):.2f} |"
            )
        o = self.overall
        nm = "-" if o.get("nm_valid") is None else ("yes" if o["nm_valid"] else f"NO ({o['nm_violations']})")
        lines.append(f"| **overall** ({o.get('layers', 0)} layers) | | {o.get('sparsity', 0.0):.4f} | {nm} | |")
        return "\n".join(lines)


def report_from_layers(
    layers: dict[str, dict[str, Any]],
    sparsity: SparsityConfig,
    extras: dict[str, dict[str, Any]] | None = None,
    **more: Any,
) -> PruneReport:
    """The report from per-layer rows of :func:`~spp.pruning.patterns.sparsity_summary` (computed block by block
    while pruning) and per-layer extras; the overall line sums the rows, then holds ``more`` (``None`` left out)."""
    extras = extras or {}
    is_nm = sparsity.kind == "nm"
    rows = [{"name": name, **layer, "nm_valid": layer.get("nm_valid"), **extras.get(name, {})}
            for name, layer in layers.items()]
    zeros = sum(r["zeros"] for r in rows)
    numel = sum(r["numel"] for r in rows)
    violations = sum(r.get("nm_violations") or 0 for r in rows)
    overall: dict[str, Any] = {
        "layers": len(rows),
        "zeros": zeros,
        "numel": numel,
        "sparsity": zeros / max(numel, 1),
        "target_ratio": sparsity.target_ratio,
        "pattern": sparsity.name,
        "nm_valid": violations == 0 if is_nm else None,
        "nm_violations": violations,
        **{k: v for k, v in more.items() if v is not None},
    }
    return PruneReport(rows, overall)
