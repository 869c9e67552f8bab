"""``adapter=losa``: LoSA (Huang et al., ICLR 2025): masked LoRA with per-block ranks from reconstruction errors."""

from spp.adapters.methods.losa.method import METHOD
from spp.adapters.registry import register

register(METHOD)
