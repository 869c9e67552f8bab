"""Save a random LLaMA (TinyLlama-1.1B shape), magnitude-pruned 2:4 in its 7 projections, for generate.py.

Use (CUDA): PYTHONPATH=. python docs/results/generate_sparse24_h100_model.py /tmp/m24   (docs/generate.md)
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spp.models import tiny_tokenizer
from spp.projections import DEFAULT_TARGETS

out = sys.argv[1]
cfg = LlamaConfig(vocab_size=260, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                  num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                  bos_token_id=1, eos_token_id=2, pad_token_id=3)
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
with torch.no_grad():
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in DEFAULT_TARGETS:
            w = mod.weight.view(mod.weight.shape[0], -1, 4)
            w.scatter_(-1, w.abs().argsort(dim=-1)[..., :2], 0.0)
model.generation_config.eos_token_id = None  # random weights: never stop early, time all new tokens
model.save_pretrained(out)
tiny_tokenizer().save_pretrained(out)
print("saved", out, sum(p.numel() for p in model.parameters()) / 1e9, "B params")
