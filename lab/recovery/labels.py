"""Names of the campaign's settings and methods in its tables."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lab.labels import method_labels
from lab.recovery.records import SETTINGS


def setting_label(setting: str) -> str:
    """``nm2_4`` -> ``Wanda 2:4``; ``dense`` -> ``Dense``."""
    return "Dense" if setting == "dense" else SETTINGS.get(setting, setting)


def method_label(method: str) -> str:
    """``spp`` -> ``SPP``; ``spp+distill`` -> ``SPP (distill)``; ``dense``, ``pruned`` unchanged."""
    base, _, variant = method.partition("+")
    name = method_labels().get(base, base)
    return f"{name} ({variant})" if variant else name


def rate(lr: float) -> str:
    """A learning rate as the grid directories write it: ``3e-3``, ``1e-1`` (``%g`` when not one digit)."""
    from lab.recovery.selection import mantissa_exponent

    try:
        return "{}e{}".format(*mantissa_exponent(lr))
    except ValueError:
        return f"{lr:g}"


def verdict(high: float, low: float, seeds: int, a: str = "method", b: str = "SPP") -> str:
    """Which side a paired ratio ``a / b``'s interval excludes 1 on. With one seed the interval covers the windows
    only, not the seed's own variation (at Wanda 2:4 one seed's ratio ranged 0.994-1.042 over three seeds), so it
    names no winner."""
    side = f"{a} lower" if high < 1.0 else f"{b} lower" if low > 1.0 else ""
    if seeds < 2:
        return f"{side} on 1 seed (windows only)" if side else "not distinguishable"
    return side.replace("lower", "better") if side else "not distinguishable"


def cpu_capabilities(runs: Iterable[Any]) -> str:
    """The CPU capabilities runs recorded in ``machine.json`` (``AVX2``; two kinds joined by ``+``: the runs mix
    machines)."""
    return " + ".join(sorted({r.machine.get("cpu_capability", "?") for r in runs})) or "?"


def interval_text(low: float | None, high: float | None) -> str:
    """``[0.991, 1.055]``, or ``–`` when there is no interval."""
    return "–" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"
