"""``reconstruct=``: block-wise reconstruction against the dense model after pruning (``conf/reconstruct/*.yaml``).
EBFT, arXiv 2402.12419; "A Free Lunch in LLM Compression", arXiv 2510.14444; ``docs/reconstruction.md``."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from spp.errors import UserError
from spp.job_base import Validated


class ReconstructLoss(str, Enum):
    """What each block minimises: ``mse`` (the mean squared error over tokens and features) or ``nmse`` (per token
    ‖h − h_dense‖² / ‖h_dense‖², averaged over tokens)."""

    mse = "mse"
    nmse = "nmse"


class ReconstructInputs(str, Enum):
    """What enters block ``i`` while it trains: ``sparse`` (the outputs of the already reconstructed blocks before
    it) or ``dense`` (the dense model's own hidden states); what the outputs must match: ``reconstruct.targets``."""

    sparse = "sparse"
    dense = "dense"


class ReconstructTargets(str, Enum):
    """What block ``i``'s outputs are trained to match: ``dense`` (the dense block on the dense model's own hidden
    states: the dense model's trajectory) or ``same_inputs`` (the dense block on the inputs the pruned block trains
    on: EBFT's target, Free-Lunch's default). With ``inputs=dense`` the two are the same."""

    dense = "dense"
    same_inputs = "same_inputs"


class ReconstructSchedule(str, Enum):
    """The learning rate over a block's steps: ``linear`` (decay to 0), ``cosine`` (to 0) or ``constant``."""

    linear = "linear"
    cosine = "cosine"
    constant = "constant"


RECONSTRUCTIONS = ("none", "blockwise")


@dataclass
class ReconstructConfig(Validated):
    """Block-wise reconstruction (``reconstruct=none`` is off, the default; ``reconstruct=blockwise`` on).

    Attributes:
        name: ``none`` or ``blockwise``.
        form: The trainable form of each block: any registered adapter method (``spp``, ``masked_full``,
            ``norms``, ``scale_lora``, ``sparse_lora``); its options come from ``conf/adapter/<form>.yaml``. Its
            default is set once, in ``conf/reconstruct/blockwise.yaml``.
        form_options: Overrides of the form's adapter options (``{r: 8, dropout: 0.0}``).
        loss: ``mse`` or ``nmse`` (:class:`ReconstructLoss`).
        inputs: ``sparse`` or ``dense`` (:class:`ReconstructInputs`).
        targets: ``dense`` or ``same_inputs`` (:class:`ReconstructTargets`).
        source: Calibration text: ``c4``, ``wikitext2``, ``alpaca`` or a local file (as ``calibration.source``).
        path: Data file to read instead of the source's default.
        nsamples: Calibration windows.
        seqlen: Tokens per window.
        seed: Seed of the window draw and of each epoch's order.
        epochs: Passes over the windows per block.
        batch_size: Windows per optimiser step (over every rank together).
        lr: AdamW learning rate of the form's tensors; ``None`` (the default): the form's own rate
            (``AdapterMethod.reconstruct_lr``: SPP 0.1, masked full 3e-3, norms 1e-3, chosen on validation PPL).
        weight_decay: AdamW weight decay.
        schedule: ``linear``, ``cosine`` or ``constant`` (:class:`ReconstructSchedule`).
        warmup_steps: Linear warm-up steps of each block.
        dtype: Precision the block trains and the activations are kept in (``float32`` or ``bfloat16``); the
            merged weights go home in the model's own dtype.
    """

    name: str = "none"
    form: str = ""
    form_options: dict[str, Any] = field(default_factory=dict)
    loss: ReconstructLoss = ReconstructLoss.mse
    inputs: ReconstructInputs = ReconstructInputs.sparse
    targets: ReconstructTargets = ReconstructTargets.dense
    source: str = "c4"
    path: str | None = None
    nsamples: int = 128
    seqlen: int = 2048
    seed: int = 0
    epochs: int = 3
    batch_size: int = 4
    lr: float | None = None
    weight_decay: float = 0.0
    schedule: ReconstructSchedule = ReconstructSchedule.linear
    warmup_steps: int = 0
    dtype: str = "float32"

    @property
    def enabled(self) -> bool:
        """Whether reconstruction runs."""
        return self.name != "none"

    def validate(self) -> ReconstructConfig:
        """Raise :class:`UserError` naming the key when a value is out of range; return ``self``."""
        checks = [
            (self.name in RECONSTRUCTIONS, "name", f"choose one of {list(RECONSTRUCTIONS)}"),
            (bool(self.form) or not self.enabled, "form", "name an adapter method (conf/reconstruct/blockwise.yaml "
             "sets spp)"),
            (self.nsamples >= 1, "nsamples", "set it >= 1"),
            (self.seqlen >= 2, "seqlen", "set it >= 2"),
            (self.epochs >= 1, "epochs", "set it >= 1 (reconstruct=none turns reconstruction off)"),
            (self.batch_size >= 1, "batch_size", "set it >= 1"),
            (self.lr is None or self.lr > 0, "lr", "set a positive learning rate, or null for the form's own"),
            (self.weight_decay >= 0, "weight_decay", "set it >= 0"),
            (self.warmup_steps >= 0, "warmup_steps", "set it >= 0"),
            (self.dtype in ("float32", "bfloat16"), "dtype", "choose float32 or bfloat16"),
        ]
        for ok, key, fix in checks:
            if not ok:
                raise UserError(f"reconstruct.{key}={getattr(self, key)!r} is not valid", fix, key=f"reconstruct.{key}")
        return self

    def steps_per_block(self) -> int:
        """Optimiser steps of one block: ``epochs × ceil(nsamples / batch_size)``."""
        return self.epochs * -(-self.nsamples // self.batch_size)
