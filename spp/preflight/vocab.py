"""The tokenizer's ids against the model's embedding: a tokenizer larger than the model's vocabulary would end the
run in an ``IndexError`` inside the embedding (the sample completion, calibration, the teacher or the student)."""

from __future__ import annotations

from typing import Any

from spp.errors import UserError
from spp.models.config import ModelConfig
from spp.models.loading import has_tokenizer_files, load_tokenizer, resolve_source


def check_vocab(cfg: ModelConfig, arch: dict[str, Any]) -> None:
    """Refuse, in one line, a tokenizer with more ids than ``arch["vocab_size"]`` (the model's embedding rows).

    Only ``tiny`` and local folders with tokenizer files are checked (their tokenizer loads in a second); a GGUF
    file carries the tokenizer of its own weights, and a hub id would need the hub.
    """
    vocab = arch.get("vocab_size")
    try:
        kind, where, _ = resolve_source(cfg)
    except FileNotFoundError:
        return  # the model's own check names a missing model.path
    if vocab is None or kind not in ("tiny", "dir") or (kind == "dir" and not has_tokenizer_files(where)):
        return
    try:
        size = len(load_tokenizer(cfg))
    except FileNotFoundError:
        return  # an unreadable tokenizer is refused where it is loaded
    if size > int(vocab):
        raise UserError(f"the tokenizer of model.path={cfg.path!r} has {size} tokens but the model's vocabulary "
                        f"(vocab_size) has {int(vocab)}: token ids >= {int(vocab)} have no embedding row",
                        "use the tokenizer the model was trained with, or resize the model's embeddings "
                        "(model.resize_token_embeddings(len(tokenizer))) and save it", key="model.path")
