"""Model configs and loading (local HF directory, GGUF file, embedded SmolLM2, hub id, tiny random LLaMA)."""

from spp.models.config import ModelConfig
from spp.models.loading import embedded_gguf_path, load_model, load_tokenizer, model_identity
from spp.models.tiny import tiny_llama, tiny_tokenizer

__all__ = [
    "ModelConfig",
    "embedded_gguf_path",
    "load_model",
    "load_tokenizer",
    "model_identity",
    "tiny_llama",
    "tiny_tokenizer",
]
