"""``adapter=lora``: the paper's LoRA* baseline (Table 4): peft LoRA, merged, then re-masked (``lora_star``)."""

from spp.adapters.methods.lora.method import METHOD
from spp.adapters.registry import register

register(METHOD)
