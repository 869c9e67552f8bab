"""``adapter=scale_lora``: PERP's ScaleLoRA (``layer``: the layer, its autograd function, files; ``method``)."""

from spp.adapters.methods.scale_lora.method import METHOD
from spp.adapters.registry import register

register(METHOD)
