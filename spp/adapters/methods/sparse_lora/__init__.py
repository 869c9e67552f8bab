"""``adapter=sparse_lora``: SparsePEFT (SQFT): LoRA whose update is masked by the pruning mask (``layer``)."""

from spp.adapters.methods.sparse_lora.method import METHOD
from spp.adapters.registry import register

register(METHOD)
