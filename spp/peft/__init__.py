"""spp's adapter methods as registered peft methods: ``import spp.peft`` registers each method that has a peft form
(SPP as ``peft_type: SPP``, SparsePEFT as ``SPARSE_LORA``, LoRA* as ``LORA_STAR``; each method's tuner lives in its
own folder, ``spp/adapters/methods/<name>/peft_tuner.py``) and exports what they export.

Then ``peft.get_peft_model(model, SPPConfig(...))`` adapts a model with spp's own ``SPPLinear`` layers (same init and
forward as ``spp.inject``), ``PeftModel.from_pretrained`` reads the adapter folder a ``train.py`` run writes, and
``merge_and_unload()`` keeps every zero of the pruned weights; ``SparseLoraConfig`` does the same for SparsePEFT,
``LoraStarConfig`` for LoRA*. A folder ``train.py`` wrote is refused on another base than the one it records. Default
targets are the model's own decoder-block projections (any supported family, GPT-2's ``Conv1D`` included). See
``docs/peft.md``.
"""

from typing import Any

from spp.adapters.peft_base import peft_type as peft_type
from spp.peft.registration import register_methods

_EXPORTS: dict[str, Any] = register_methods()
globals().update(_EXPORTS)

__all__ = sorted([*_EXPORTS, "peft_type"])  # the methods' exports, known once registered
