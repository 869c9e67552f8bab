"""Shared fixtures: offline mode, the in-repo sample data, and tiny random LLaMA models."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread per process: the tiny models gain nothing from more, and on a loaded 2-core machine
# oversubscribed OpenMP threads make tests up to 30x slower. Subprocesses (train.py, DDP ranks) inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from spp.models.tiny import tiny_llama, tiny_tokenizer  # noqa: E402
from spp.paths import SAMPLE_DATA_DIR  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def sample_data_dir() -> Path:
    """The small real data shipped in ``data/`` (tests never depend on ``../shared``)."""
    return SAMPLE_DATA_DIR


@pytest.fixture()
def tiny_model() -> torch.nn.Module:
    """A fresh tiny random ``LlamaForCausalLM`` (fp32, eval mode, seed 0)."""
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def tiny_tok():
    """The byte-level tokenizer matching ``tiny_model``'s vocabulary."""
    return tiny_tokenizer()
