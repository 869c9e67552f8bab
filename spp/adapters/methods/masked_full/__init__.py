"""``adapter=masked_full``: masked full fine-tuning, the upper bound (``masked_full``: hooks, memory estimate)."""

from spp.adapters.methods.masked_full.method import METHOD
from spp.adapters.registry import register

register(METHOD)
