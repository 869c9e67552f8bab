"""Names of the campaign's settings and methods in its tables."""

from __future__ import annotations

from spp.experiments.campaign import method_labels
from spp.experiments.campaign33.records import SETTINGS


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
    from spp.experiments.campaign33.selection import mantissa_exponent

    try:
        return "{}e{}".format(*mantissa_exponent(lr))
    except ValueError:
        return f"{lr:g}"
