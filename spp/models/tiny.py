"""Tiny random LLaMA models and a byte-level tokenizer, built in code for tests (nothing downloaded)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>")
TINY_VOCAB_SIZE: int = 256 + len(SPECIAL_TOKENS)

TINY_ARCH: dict[str, Any] = {
    "vocab_size": TINY_VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def tiny_llama_config(**overrides: Any) -> LlamaConfig:
    """Return a small ``LlamaConfig`` (64 hidden, 2 layers, GQA 4/2 heads) with the tiny tokenizer's ids."""
    fields = {**TINY_ARCH, **overrides}
    fields.setdefault("bos_token_id", SPECIAL_TOKENS.index("<s>"))
    fields.setdefault("eos_token_id", SPECIAL_TOKENS.index("</s>"))
    fields.setdefault("pad_token_id", SPECIAL_TOKENS.index("<pad>"))
    return LlamaConfig(**fields)


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> LlamaForCausalLM:
    """Build a randomly initialised tiny ``LlamaForCausalLM`` deterministically from ``seed``."""
    config = tiny_llama_config(**overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Return a byte-level tokenizer (one token per UTF-8 byte, ids 4..259; specials 0..3), no BOS added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: i + len(SPECIAL_TOKENS) for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=TINY_ARCH["max_position_embeddings"],
    )
