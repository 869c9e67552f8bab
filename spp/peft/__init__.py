"""SPP as a registered peft method (``peft_type: SPP``).

``from spp.peft import SPPConfig`` registers it; then ``peft.get_peft_model(model, SPPConfig(...))`` adapts a model
with spp's own ``SPPLinear`` layers (same init and forward as ``spp.inject``), ``PeftModel.from_pretrained`` reads
the adapter folder a ``train.py`` run writes, and ``merge_and_unload()`` keeps every zero of the pruned weights.
See ``docs/peft.md``. Importing this package imports peft; nothing else in ``spp`` imports it.
"""

from spp.peft.config import SPPConfig
from spp.peft.layer import SPPLayer
from spp.peft.loading import from_spp_adapter
from spp.peft.model import SPPModel
from spp.peft.registration import peft_type, register

register(SPPConfig, SPPModel)

__all__ = ["SPPConfig", "SPPLayer", "SPPModel", "from_spp_adapter", "peft_type"]
