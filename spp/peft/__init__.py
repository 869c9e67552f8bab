"""SPP, SparsePEFT and LoRA* as registered peft methods (``peft_type: SPP`` / ``SPARSE_LORA`` / ``LORA_STAR``).

``from spp.peft import SPPConfig`` registers both; then ``peft.get_peft_model(model, SPPConfig(...))`` adapts a model
with spp's own ``SPPLinear`` layers (same init and forward as ``spp.inject``), ``PeftModel.from_pretrained`` reads
the adapter folder a ``train.py`` run writes, and ``merge_and_unload()`` keeps every zero of the pruned weights.
``SparseLoraConfig`` does the same for SparsePEFT (LoRA merged as ``W + s·(B A) ⊙ M``, spp's ``SparseLoraLinear``),
``LoraStarConfig`` for LoRA* (plain LoRA, merge re-masked). A folder ``train.py`` wrote is refused on another base
than the one it records (:mod:`spp.peft.base_record`).
Default targets are the model's own decoder-block projections (any supported family, GPT-2's ``Conv1D`` included).
See ``docs/peft.md``. Importing this package imports peft; nothing else in ``spp`` imports it.
"""

from spp.peft.config import SPPConfig
from spp.peft.layer import SPPLayer
from spp.peft.loading import from_spp_adapter
from spp.peft.lora_star import LoraStarConfig, LoraStarModel, from_lora_star_adapter
from spp.peft.model import SPPModel
from spp.peft.registration import LORA_STAR_NAME, SPARSE_LORA_NAME, SPARSE_LORA_PREFIX, peft_type, register_with_peft
from spp.peft.sparse_lora import SparseLoraConfig, SparseLoraModel, from_sparse_lora_adapter

register_with_peft(SPPConfig, SPPModel)
register_with_peft(SparseLoraConfig, SparseLoraModel, name=SPARSE_LORA_NAME, prefix=SPARSE_LORA_PREFIX)
register_with_peft(LoraStarConfig, LoraStarModel, name=LORA_STAR_NAME, prefix=SPARSE_LORA_PREFIX)

__all__ = ["LoraStarConfig", "LoraStarModel", "SPPConfig", "SPPLayer", "SPPModel", "SparseLoraConfig",
           "SparseLoraModel", "from_lora_star_adapter", "from_sparse_lora_adapter", "from_spp_adapter", "peft_type"]
