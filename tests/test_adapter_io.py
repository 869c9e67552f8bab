"""save_adapter / load_adapter: only alpha and beta on disk, bit-exact round trip, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from spp import inject, load_adapter, read_adapter_config, save_adapter, spp_layers
from spp.models.tiny import tiny_llama


def trained(dtype=torch.float32, **kwargs):
    model = tiny_llama(seed=0, dtype=dtype)
    inject(model, **kwargs)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in spp_layers(model).values():
            layer.spp_alpha.copy_(torch.randn(layer.spp_alpha.shape, generator=gen))
            if layer.spp_beta is not None:
                layer.spp_beta.copy_(torch.randn(layer.spp_beta.shape, generator=gen))
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_bit_exact_into_uninjected_model(tmp_path, dtype):
    model = trained(dtype, r=8, dropout=0.1, impl="blocked")
    save_adapter(model, tmp_path / "ad", extra_config={"pruner": "wanda"})
    assert sorted(p.name for p in (tmp_path / "ad").iterdir()) == ["adapter_config.json",
                                                                    "adapter_model.safetensors"]
    state = load_file(tmp_path / "ad" / "adapter_model.safetensors")
    assert len(state) == 2 * 14 and all(k.endswith((".spp_alpha", ".spp_beta")) for k in state)
    config = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert config["layer_kwargs"]["r"] == 8 and config["layer_kwargs"]["impl"] == "blocked"
    assert config["extra"] == {"pruner": "wanda"}

    fresh = tiny_llama(seed=0, dtype=dtype)
    load_adapter(fresh, tmp_path / "ad")
    src, dst = spp_layers(model), spp_layers(fresh)
    assert list(src) == list(dst)
    for name in src:
        assert dst[name].r == 8 and dst[name].dropout_p == 0.1 and dst[name].impl == "blocked"
        # SPP tensors are fp32 whatever the base dtype (adapter.dtype), and round-trip bit for bit
        assert dst[name].spp_alpha.dtype == torch.float32 and dst[name].base.weight.dtype == dtype
        assert torch.equal(dst[name].spp_alpha.view(torch.int32), src[name].spp_alpha.view(torch.int32))
        assert torch.equal(dst[name].spp_beta.view(torch.int32), src[name].spp_beta.view(torch.int32))
    ids = torch.randint(0, 260, (1, 8), generator=torch.Generator().manual_seed(0))
    assert torch.equal(fresh.eval()(ids).logits, model.eval()(ids).logits)


def test_load_into_injected_model_and_no_beta(tmp_path):
    model = trained(targets=("q_proj", "down_proj"), r=4, use_beta=False, alpha_init="zeros")
    save_adapter(model, tmp_path)
    assert read_adapter_config(tmp_path)["targets"] == ["down_proj", "q_proj"]
    other = tiny_llama(seed=0)
    inject(other, targets=("q_proj", "down_proj"), r=4, use_beta=False, alpha_init="zeros")
    load_adapter(other, tmp_path)
    for name, layer in spp_layers(other).items():
        assert layer.spp_beta is None
        assert torch.equal(layer.spp_alpha, spp_layers(model)[name].spp_alpha)


def test_adapter_errors(tmp_path):
    with pytest.raises(ValueError, match="no SPPLinear"):
        save_adapter(tiny_llama(), tmp_path)
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_adapter(tiny_llama(), tmp_path)
    save_adapter(trained(r=8), tmp_path / "r8")
    other = tiny_llama()
    inject(other, r=4)
    with pytest.raises(ValueError, match=r"spp_alpha has shape \(8, 64\) in the file but \(4, 64\)"):
        load_adapter(other, tmp_path / "r8")
    partial = tiny_llama()
    inject(partial, targets=("q_proj",), r=8)
    with pytest.raises(ValueError, match="SPP layers differ"):
        load_adapter(partial, tmp_path / "r8")
    (tmp_path / "peft").mkdir()
    (tmp_path / "peft" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    with pytest.raises(ValueError, match="not an SPP adapter"):
        load_adapter(tiny_llama(), tmp_path / "peft")
    merged = trained(r=8)
    next(iter(spp_layers(merged).values())).merge()
    with pytest.raises(ValueError, match="are merged"):
        save_adapter(merged, tmp_path / "m")


def test_load_into_model_injected_with_other_scale_is_refused(tmp_path):
    """The file's ``scale``/``residual`` set the outputs: a model injected with others would load silently wrong."""
    save_adapter(trained(r=8, scale=1.0), tmp_path)
    same = tiny_llama(seed=0)
    inject(same, r=8, scale=1.0, impl="naive", dropout=0.0)  # impl and dropout do not change the adapted weight
    load_adapter(same, tmp_path)
    other = tiny_llama(seed=0)
    inject(other, r=8, scale=2.0)
    with pytest.raises(ValueError, match=r"scale=2.0 but .* records scale=1.0"):
        load_adapter(other, tmp_path)
