"""``adapter=norms``: PERP's retraining baseline, normalisation weights and biases only (``method``)."""

from spp.adapters.methods.norms.method import METHOD
from spp.adapters.registry import register

register(METHOD)
