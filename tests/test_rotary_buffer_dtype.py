"""``load_model`` / ``load_skeleton`` in bfloat16 hold every buffer as ``from_pretrained(dtype=torch.bfloat16)``
does: RoPE's ``inv_freq`` / ``original_inv_freq`` in float32 with the same values (not rounded to bf16), Gemma-2's
``embed_scale`` in bf16, and the same logits at long positions."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from spp.models.config import ModelConfig
from spp.models.loading import load_model, load_skeleton
from spp.models.tiny import tiny_model

FAMILIES = ["llama", "qwen2", "gemma2"]


def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: b for n, b in model.named_buffers() if b.is_floating_point()}


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    """A tiny fp32 model of the family saved to a folder, and ``from_pretrained(dtype=bfloat16)`` of it."""
    folder = tmp_path_factory.mktemp(request.param)
    tiny_model(seed=0, model_type=request.param).save_pretrained(folder)
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()


def test_load_model_keeps_buffers_as_from_pretrained(saved):
    folder, reference = saved
    model, _ = load_model(ModelConfig(name="t", path=str(folder), torch_dtype="bfloat16"), with_tokenizer=False)
    want = _buffers(reference)
    assert want["model.rotary_emb.inv_freq"].dtype == torch.float32  # what transformers does
    got = _buffers(model)
    assert set(got) == set(want)
    for name, buffer in want.items():
        assert got[name].dtype == buffer.dtype, name
        assert torch.equal(got[name], buffer), name
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    ids = torch.arange(4, 500).unsqueeze(0) % 250 + 4  # positions up to 495: rounding inv_freq moves the angles
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


def test_skeleton_buffers_match_rank0(saved):
    folder, reference = saved
    skeleton = load_skeleton(ModelConfig(name="t", path=str(folder), torch_dtype="bfloat16"))
    want, got = _buffers(reference), _buffers(skeleton)
    assert {n: b.dtype for n, b in got.items()} == {n: b.dtype for n, b in want.items()}
    assert torch.equal(got["model.rotary_emb.inv_freq"], want["model.rotary_emb.inv_freq"])


def test_tiny_in_bf16_keeps_fp32_frequencies_and_its_weights():
    fp32, _ = load_model(ModelConfig(name="tiny", path="tiny"), with_tokenizer=False)
    bf16, _ = load_model(ModelConfig(name="tiny", path="tiny", torch_dtype="bfloat16"), with_tokenizer=False)
    inv = bf16.model.rotary_emb.inv_freq
    assert inv.dtype == torch.float32 and torch.equal(inv, fp32.model.rotary_emb.inv_freq)
    rounded = fp32.model.rotary_emb.inv_freq.to(torch.bfloat16).float()  # negative control: what .to() gave
    assert not torch.equal(rounded, inv)
    for (name, p16), p32 in zip(bf16.named_parameters(), fp32.parameters(), strict=True):
        assert torch.equal(p16, p32.to(torch.bfloat16)), name  # the same weights as before, rounded once
