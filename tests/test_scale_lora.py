"""ScaleLoRA (PERP, arXiv 2312.15230) against its defining formula ``y = x (W ⊙ (B A))ᵀ + bias`` computed directly
with autograd in float64: forward and the gradients of ``x``, ``A`` and ``B`` (whole and chunked), the 1/√r init
(``B A`` = 1: the pruned model), the merge (zeros kept, bit-identical zeros), files and the method's interface."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import spp.adapters.chunks as chunks
import spp.adapters.methods.scale_lora.layer as sl
from lab.table1_params import count_method_parameters, model_arch
from spp.adapters import apply_adapter, get_method, make_config
from spp.adapters.methods.scale_lora.layer import (
    ScaleLoRALinear,
    inject_scale_lora,
    load_scale_lora,
    merge_scale_lora,
    save_scale_lora,
    scale_lora_layers,
)
from spp.adapters.registry import load_adapter_dir, option_config, save_adapter_dir
from spp.errors import UserError
from spp.models.tiny import tiny_llama
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model

F64 = torch.float64


def _layer(m: int = 24, n: int = 20, r: int = 4, bias: bool = True, seed: int = 0) -> ScaleLoRALinear:
    """A 2:4-pruned float64 linear wrapped by ScaleLoRA, with A and B drawn away from their init."""
    gen = torch.Generator().manual_seed(seed)
    base = nn.Linear(n, m, bias=bias, dtype=F64)
    with torch.no_grad():
        base.weight.copy_(torch.randn(m, n, generator=gen, dtype=F64))
        base.weight.view(m, -1, 4)[..., :2] = 0  # 2:4
        if bias:
            base.bias.copy_(torch.randn(m, generator=gen, dtype=F64))
    layer = ScaleLoRALinear(base, r=r, dtype=F64)
    with torch.no_grad():
        layer.scale_lora_A.add_(torch.randn(layer.scale_lora_A.shape, generator=gen, dtype=F64) * 0.3)
        layer.scale_lora_B.add_(torch.randn(layer.scale_lora_B.shape, generator=gen, dtype=F64) * 0.3)
    return layer


def _reference(layer: ScaleLoRALinear, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """``y = x (W ⊙ (B A))ᵀ + bias`` and ``(dx, dA, dB)`` of ``sum(y * g)`` for a fixed ``g``, by plain autograd."""
    a = layer.scale_lora_A.detach().clone().requires_grad_(True)
    b = layer.scale_lora_B.detach().clone().requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    w, bias = layer.base.weight.detach(), layer.base.bias
    y = xr @ (w * (b @ a)).t() + (bias.detach() if bias is not None else 0.0)
    g = torch.linspace(-1, 1, y.numel(), dtype=F64).view_as(y)
    (y * g).sum().backward()
    return y.detach(), (xr.grad, a.grad, b.grad)


def _ours(layer: ScaleLoRALinear, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    layer.zero_grad()
    xr = x.detach().clone().requires_grad_(True)
    y = layer(xr)
    g = torch.linspace(-1, 1, y.numel(), dtype=F64).view_as(y)
    (y * g).sum().backward()
    return y.detach(), (xr.grad, layer.scale_lora_A.grad, layer.scale_lora_B.grad)


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "row_chunks"])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_gradients_equal_the_formula_in_float64(chunked, bias, monkeypatch):
    if chunked:  # 24 rows in chunks of 5: the large-layer path
        monkeypatch.setattr(chunks, "row_chunks", lambda m, n: [(lo, min(lo + 5, m)) for lo in range(0, m, 5)])
    layer = _layer(bias=bias)
    x = torch.randn(3, 7, 20, generator=torch.Generator().manual_seed(1), dtype=F64)
    y, grads = _ours(layer, x)
    y_ref, grads_ref = _reference(layer, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for got, want, name in zip(grads, grads_ref, ("x", "A", "B"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11, msg=name)
    assert layer.base.weight.grad is None  # the pruned weight is frozen


def test_gradcheck():
    layer = _layer(m=8, n=8, r=2)
    x = torch.randn(2, 8, dtype=F64, requires_grad=True)
    fn = sl.scale_lora_product
    assert torch.autograd.gradcheck(lambda x, a, b: fn(x, layer.base.weight, a, b, layer.base.bias),
                                    (x, layer.scale_lora_A, layer.scale_lora_B))


def test_init_is_one_over_sqrt_r_so_the_layer_starts_as_the_pruned_one():
    base = nn.Linear(20, 24, dtype=F64)
    layer = ScaleLoRALinear(copy.deepcopy(base), r=4, dtype=F64)
    assert torch.equal(layer.scale_lora_A, torch.full((4, 20), 0.5, dtype=F64))
    assert torch.equal(layer.scale_lora_B, torch.full((24, 4), 0.5, dtype=F64))
    assert torch.equal(layer.multiplier(), torch.ones(24, 20, dtype=F64))
    x = torch.randn(5, 20, dtype=F64)
    torch.testing.assert_close(layer(x), base(x), rtol=1e-14, atol=1e-14)
    r3 = ScaleLoRALinear(nn.Linear(4, 4), r=3)
    assert r3.scale_lora_A[0, 0].item() == pytest.approx(1 / math.sqrt(3)) and r3.scale_lora_A.dtype == torch.float32


@pytest.mark.parametrize("dtype", [F64, torch.bfloat16])
def test_merge_multiplies_in_place_and_keeps_every_zero(dtype):
    layer = _layer()
    layer.base.to(dtype)
    with torch.no_grad():
        layer.scale_lora_B[0].zero_()  # row 0's factor is 0: its kept weights become zero (reported)
    w = layer.base.weight.detach().clone()
    expected = (w.double() * (layer.scale_lora_B.double() @ layer.scale_lora_A.double())).to(dtype)
    model = nn.Sequential(layer)
    with pytest.warns(UserWarning, match="into zeros"):
        merged, stats = merge_scale_lora(model)
    weight = merged[0].weight
    assert isinstance(merged[0], nn.Linear) and weight.dtype == dtype
    assert torch.equal(weight[w != 0], expected[w != 0]) and bool((weight[w == 0] == 0).all())
    assert torch.equal(torch.signbit(weight[w == 0]), torch.signbit(w[w == 0]))  # zeros copied, same bits
    assert stats == {"layers": 1, "made_zero": int((w[0] != 0).sum())}


def _pruned_tiny():
    model = tiny_llama(seed=0)
    masks = prune_model(model, None, PrunerConfig(name="magnitude"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                        device="cpu").masks
    return model, masks


def _trained(model: nn.Module) -> nn.Module:
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def test_adapter_files_round_trip_bit_exact_and_load_merges_as_the_export(tmp_path):
    model, masks = _pruned_tiny()
    cfg = option_config("scale_lora", r=4)
    assert cfg.r == 4 and type(cfg).__name__ == "ScaleLoRAConfig"
    adapted, trainable = apply_adapter(copy.deepcopy(model), cfg, masks)
    assert len(trainable) == 28 and all(n.endswith(("scale_lora_A", "scale_lora_B")) for n in trainable)
    _trained(adapted)
    method = get_method("scale_lora")
    save_adapter_dir(method, adapted, tmp_path / "adapter", {"pruner": "magnitude"}, cfg)
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "adapter_method.json", "adapter_model.safetensors", "scale_lora.json"]
    loaded, meta = load_scale_lora(copy.deepcopy(model), tmp_path / "adapter")
    assert meta["r"] == 4 and meta["extra"] == {"pruner": "magnitude"}
    for name, layer in scale_lora_layers(adapted).items():
        other = scale_lora_layers(loaded)[name]
        assert torch.equal(layer.scale_lora_A, other.scale_lora_A)
        assert torch.equal(layer.scale_lora_B, other.scale_lora_B)
    merged, info = load_adapter_dir(copy.deepcopy(model), tmp_path / "adapter", masks)
    reference, stats = method.merge(adapted, cfg, masks)
    assert info == {"method": "scale_lora", "r": 4, "merge": stats}
    ref = dict(reference.named_parameters())
    assert all(torch.equal(p, ref[n]) for n, p in merged.named_parameters())


def test_loading_another_methods_files_is_one_user_error(tmp_path):
    model, masks = _pruned_tiny()
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="adapter_dir=.*no scale_lora.json") as err:
        get_method("scale_lora").load(model, tmp_path / "empty", masks)
    assert err.value.key == "adapter_dir"
    with pytest.raises(ValueError, match="already holds ScaleLoRA"):
        inject_scale_lora(inject_scale_lora(copy.deepcopy(model), ["q_proj"]), ["q_proj"])
    with pytest.raises(FileNotFoundError):
        load_scale_lora(model, tmp_path / "empty")
    with pytest.raises(ValueError, match="no ScaleLoRA layer"):
        save_scale_lora(model, tmp_path / "none")


def test_config_keys_and_refusals():
    assert make_config("scale_lora").r == 8
    with pytest.raises(ValueError, match="adapter.r=0 must be >= 1"):
        make_config("scale_lora", r=0)
    with pytest.raises(TypeError):
        make_config("scale_lora", lora_alpha=16.0)  # not a ScaleLoRA key


def test_table1_counts_r_times_m_plus_n():
    cfg = model_arch("llama7b")
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    row = count_method_parameters("llama7b", "scale_lora", r=8)
    assert row.trainable == layers * 8 * (4 * (h + h) + 2 * (i + h) + (h + i))
    assert row.r == 8 and row.total == count_method_parameters("llama7b", "masked_full").total + row.trainable
