"""The linear projections of a LLaMA decoder block that are pruned and adapted (one constant for the project)."""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The seven projections of every decoder block: pruned by the pruners, adapted by SPP and the baselines (paper
Sec. 4; the authors' ``lora_target_modules``)."""

ATTENTION_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The attention projections (DS⊘T refines only these by default, as its reference code)."""


def matches(name: str, targets: Iterable[str]) -> bool:
    """True when the module path ``name`` equals a target or ends with ``.<target>``."""
    return any(name == t or name.endswith("." + t) for t in targets)
