"""Tiny random 2-block models of every supported family and a byte-level tokenizer, built in code.

Dims divide by r = 16 and by 4 (2:4); each family keeps its quirks (Qwen2 q/k/v biases, Qwen3 q/k norms and
mixed attention, sliding windows shorter than the test sequences, tied embeddings, Phi-3 fused projections, OPT's
ReLU MLP, GPT-2's ``Conv1D``)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, PreTrainedConfig, PreTrainedTokenizerFast

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


_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
_WINDOW = {"sliding_window": 32}  # shorter than the calibration and test windows, so the window matters

TINY_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {**_HEADS, "model_type": "qwen2"},
    "qwen3": {**_HEADS, **_WINDOW, "model_type": "qwen3", "use_sliding_window": True, "max_window_layers": 1},
    "mistral": {**_HEADS, **_WINDOW, "model_type": "mistral"},
    "gemma2": {**_HEADS, **_WINDOW, "model_type": "gemma2", "query_pre_attn_scalar": 16, "tie_word_embeddings": True,
               "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "phi3": {"num_attention_heads": 4, "num_key_value_heads": 2, "model_type": "phi3"},
    "opt": {"model_type": "opt", "ffn_dim": 128, "num_attention_heads": 4, "word_embed_proj_dim": 64,
            "do_layer_norm_before": True, "dropout": 0.0, "attention_dropout": 0.0},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_inner": 128, "n_layer": 2, "n_head": 4, "n_positions": 512,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
}
"""``arch`` fields that make each family's tiny model (on top of :data:`TINY_ARCH`; GPT-2 names its own). The
model's own dropout is off (as LLaMA's), so runs on 1 and N processes train to the same adapter."""

_NOT_GPT2 = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "max_position_embeddings", "rms_norm_eps")


def tiny_config(**overrides: Any) -> PreTrainedConfig:
    """A tiny config of the family ``overrides["model_type"]`` (``llama`` by default) with the tiny tokenizer's
    ids: :data:`TINY_ARCH`, the family's :data:`TINY_FAMILIES` entry, then ``overrides``."""
    model_type = overrides.get("model_type", "llama")
    if model_type not in TINY_FAMILIES:
        raise ValueError(f"model.arch.model_type={model_type!r} has no tiny config; choose one of "
                         f"{sorted(TINY_FAMILIES)}")
    base = {k: v for k, v in TINY_ARCH.items() if model_type != "gpt2" or k not in _NOT_GPT2}
    ids = {"bos_token_id": "<s>", "eos_token_id": "</s>", "pad_token_id": "<pad>"}
    fields = {**{k: SPECIAL_TOKENS.index(t) for k, t in ids.items()}, **base, **TINY_FAMILIES[model_type], **overrides}
    fields.pop("model_type", None)
    return LlamaConfig(**fields) if model_type == "llama" else AutoConfig.for_model(model_type, **fields)


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> Any:
    """Build a randomly initialised tiny causal LM (:func:`tiny_config`) deterministically from ``seed``."""
    config = tiny_config(**overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return model.to(dtype).eval()


tiny_llama = tiny_model
"""A randomly initialised tiny ``LlamaForCausalLM`` (or the ``model_type`` family's) from ``seed``."""


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
