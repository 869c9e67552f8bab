"""The training-objective interface and its registry (``objective=<name>``): one micro-batch in, the loss out.

A new objective is a config + :class:`Objective` subclass registered by :func:`register_objective` and a
``conf/objective/<name>.yaml`` (``docs/architecture.md``, "How to add ...").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from spp.errors import UserError
from spp.projections import block_class
from spp.registry import Registry

TEACHER_OUTPUTS = ("none", "logits", "block_outputs")
"""What an objective needs of the teacher per batch: nothing, its logits, or its logits and every decoder block's
output (what the memory plan counts: ``spp.planning.memory.teacher_terms``)."""


@dataclass
class ObjectiveConfig:
    """The ``objective`` group: which training loss (``objective=ce|distill|<plug-in>``); subclasses add keys.

    Attributes:
        name: The objective (``ce``: the paper's cross-entropy on the Alpaca labels; ``distill``: SquareHead-style).
    """

    name: str = "ce"

    @property
    def teacher_outputs(self) -> str:
        """What this objective needs of the dense teacher: one of :data:`TEACHER_OUTPUTS` (read by the plan)."""
        return "none"


@dataclass
class ObjectiveLoss:
    """One micro-batch's loss: ``loss`` is what is optimised (logged as ``train/loss``); ``parts`` are logged as
    ``train/<part>`` (e.g. ``ce``, ``kl``, ``feature``), detached."""

    loss: torch.Tensor
    parts: dict[str, torch.Tensor] = field(default_factory=dict)


StudentFn = Callable[..., Any]
"""The student's forward (the model or its compiled view): ``student(**batch, use_cache=False)``."""


class Objective(ABC):
    """A training objective (see the module docstring). Subclasses set :attr:`name` and :attr:`config_class`;
    ``layer_cls`` is the decoder-block class (for objectives that read block outputs)."""

    name: ClassVar[str]
    config_class: ClassVar[type[ObjectiveConfig]] = ObjectiveConfig

    def __init__(self, cfg: ObjectiveConfig, layer_cls: type[nn.Module] | None = None) -> None:
        self.cfg = cfg
        self.layer_cls = layer_cls

    @property
    def needs_teacher(self) -> bool:
        """Whether the run keeps a frozen copy of the dense model for this objective."""
        return self.cfg.teacher_outputs != "none"

    @abstractmethod
    def loss(self, student: StudentFn, batch: dict[str, torch.Tensor],
             teacher: nn.Module | None = None) -> ObjectiveLoss:
        """The loss of one micro-batch (``input_ids``, ``attention_mask``, ``labels`` with -100 where not scored)."""


def _unknown(name: str, known: list[str]) -> UserError:
    return UserError(f"objective.name={name!r} is not a registered training objective",
                     f"use objective={' | objective='.join(known)}, or a plug-in's (SPP_PLUGINS)", key="objective")


OBJECTIVES: Registry[type[Objective]] = Registry("training objective", "objective", group="objective",
                                                unknown=_unknown)
"""Every objective's class by name (:func:`register_objective`)."""


def register_objective(cls: type[Objective]) -> type[Objective]:
    """Register ``cls`` under ``cls.name`` and its config as ``objective/<name>_schema`` in Hydra's ConfigStore
    (idempotent; usable as a class decorator).

    Raises:
        TypeError: its ``config_class`` is not an :class:`ObjectiveConfig`.
        UserError: its config's ``name`` does not default to ``cls.name``, or another objective holds the name.
    """
    if not issubclass(cls.config_class, ObjectiveConfig):
        raise TypeError(f"{cls.__name__}.config_class must subclass ObjectiveConfig")
    cls.name = OBJECTIVES.register(getattr(cls, "name", None), cls, cls.config_class)  # name: the config's default
    return cls


def objective_names() -> list[str]:
    """The registered objectives (the project's own and the plug-ins loaded so far)."""
    return OBJECTIVES.names()


def get_objective(name: str) -> type[Objective]:
    """The objective class registered as ``name``.

    Raises:
        UserError: no objective has that name (names the known ones).
    """
    return OBJECTIVES.get(name)


def build_objective(cfg: ObjectiveConfig | None, layer_cls: type[nn.Module] | None = None) -> Objective:
    """The objective of ``cfg`` (``None``: cross-entropy), ready to compute losses."""
    cfg = cfg if cfg is not None else ObjectiveConfig()
    return get_objective(cfg.name)(cfg, layer_cls)


@contextmanager
def block_outputs(model: nn.Module, layer_cls: type[nn.Module] | None) -> Iterator[list[torch.Tensor]]:
    """Collect the output hidden state of every decoder block (``layer_cls``; None: the model's own) during one
    forward, in block order; a recomputation under activation checkpointing records nothing.

    Raises:
        ValueError: ``model`` has no module of ``layer_cls``.
    """
    out: list[torch.Tensor] = []
    armed = [True]

    def hook(_module: nn.Module, _args: Any, output: Any) -> None:
        if armed[0]:
            out.append(output[0] if isinstance(output, (tuple, list)) else output)

    layer_cls = layer_cls or block_class(model)  # None: model.decoder_layer_cls=auto, the model's own blocks
    blocks = [m for m in model.modules() if isinstance(m, layer_cls)]
    if not blocks:
        raise ValueError(f"no decoder block of class {getattr(layer_cls, '__name__', layer_cls)} in the model")
    handles = [m.register_forward_hook(hook) for m in blocks]
    try:
        yield out
    finally:
        armed[0] = False
        for handle in handles:
            handle.remove()


@torch.no_grad()
def teacher_forward(teacher: nn.Module, batch: dict[str, torch.Tensor],
                    layer_cls: type[nn.Module] | None = None) -> tuple[Any, list[torch.Tensor]]:
    """The teacher's forward on ``batch`` without its labels and without gradients: ``(output, block outputs)``
    (block outputs only with ``layer_cls``). An FSDP2-sharded teacher is resharded afterwards (its root would keep
    the embeddings and LM head gathered: FSDP2 does not reshard a root after forward)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with block_outputs(teacher, layer_cls) if layer_cls is not None else nullcontext([]) as blocks:
        out = teacher(**inputs, use_cache=False)
    if hasattr(teacher, "reshard"):
        teacher.reshard()
    return out, blocks
