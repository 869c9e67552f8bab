"""spp's adapter methods as registered peft methods: ``import spp.peft`` registers each one with a peft form.

SPP (``peft_type: SPP``), SparsePEFT (``SPARSE_LORA``) and LoRA* (``LORA_STAR``) then work with ``get_peft_model``,
``PeftModel.from_pretrained`` and a zero-keeping ``merge_and_unload()`` (``docs/peft.md``).
"""

from typing import Any

from spp.adapters.peft_base import peft_type as peft_type
from spp.peft.registration import register_methods

_EXPORTS: dict[str, Any] = register_methods()
globals().update(_EXPORTS)

__all__ = sorted([*_EXPORTS, "peft_type"])  # the methods' exports, known once registered
