"""SparsePEFT (adapter=sparse_lora): float64 forward/gradients against y = x W~ᵀ + s·xd·((B A) ⊙ M)ᵀ, exact zeros
after the merge in fp32/bf16/fp16, nothing m x n saved for backward but the packed mask, adapter files that reload."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from peft import PeftModel

import spp.adapters.chunks as chunks
from spp.adapters.chunks import row_chunks
from spp.adapters.config import AdapterConfig
from spp.adapters.methods.sparse_lora.layer import (
    SparseLoraLinear,
    inject_sparse_lora,
    load_sparse_lora,
    masked_lora,
    merge_sparse_lora,
    save_sparse_lora,
    sparse_lora_layers,
)
from spp.adapters.registry import apply_adapter, get_method, merge_adapter, option_config
from spp.bitmask import pack_rows, unpack_rows
from spp.models import tiny_llama
from spp.projections import DEFAULT_TARGETS

Q0 = "model.layers.0.self_attn.q_proj"
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def pruned_tiny(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """Tiny LLaMA with random 50 % masks (True = kept) on the 7 projections; some pruned zeros are -0.0."""
    model = tiny_llama(seed=seed, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    masks = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in DEFAULT_TARGETS:
                mask = torch.rand(module.weight.shape, generator=gen) < 0.5
                module.weight.mul_(mask)  # negative weights times 0 give -0.0
                masks[name] = mask
    return model, masks


def randomize_b(model: PeftModel, seed: int = 0, std: float = 0.1) -> None:
    """Non-zero B for every layer (peft starts B at 0, where the update is 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in sparse_lora_layers(model):
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=gen, dtype=torch.float64) * std)


def adapter_cfg(**overrides) -> AdapterConfig:
    """The shipped ``conf/adapter/sparse_lora.yaml`` as the typed config."""
    return option_config("sparse_lora", **overrides)


def reference(x, w, a, b, mask, s, xd=None):
    """The SparsePEFT forward written out: x W~ᵀ + s·xd·((B A) ⊙ M)ᵀ."""
    xd = x if xd is None else xd
    return x @ w.t() + s * xd @ ((b @ a) * mask).t()


@pytest.mark.parametrize("chunk", [None, 40])
def test_function_forward_and_gradients_float64(monkeypatch, chunk):
    if chunk is not None:  # force several row chunks (40 elements = 4 rows of 10)
        monkeypatch.setattr(chunks, "row_chunks", lambda m, n: row_chunks(m, n, chunk, chunk))
        assert len(chunks.row_chunks(13, 10)) == 4
    gen = torch.Generator().manual_seed(0)
    m, n, r, s = 13, 10, 3, 1.7
    x = torch.randn(2, 5, n, generator=gen, dtype=torch.float64, requires_grad=True)
    a = torch.randn(r, n, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(m, r, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(m, n, generator=gen) < 0.5
    g = torch.randn(2, 5, m, generator=gen, dtype=torch.float64)
    y = masked_lora(x, a, b, pack_rows(mask), s)
    grads = torch.autograd.grad(y, (x, a, b), g)
    expected = s * x @ ((b @ a) * mask).t()
    exp_grads = torch.autograd.grad(expected, (x, a, b), g)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, exp_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the same gradients from the closed forms G = s (gᵀ x) ⊙ M, dB = G Aᵀ, dA = Bᵀ G
    gram = s * (g.reshape(-1, m).t() @ x.detach().reshape(-1, n)) * mask
    torch.testing.assert_close(grads[2], gram @ a.detach().t(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[1], b.detach().t() @ gram, rtol=1e-12, atol=1e-12)


def test_function_gradcheck():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    a = torch.randn(2, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    packed = pack_rows(torch.rand(6, 9, generator=gen) < 0.5)
    assert torch.autograd.gradcheck(lambda x_, a_, b_: masked_lora(x_, a_, b_, packed, 0.5), (x, a, b))


@pytest.mark.parametrize("n", [1, 7, 8, 13, 64])
def test_pack_unpack_round_trip(n):
    mask = torch.rand(5, n, generator=torch.Generator().manual_seed(n)) < 0.5
    packed = pack_rows(mask)
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (5, -(-n // 8))
    assert torch.equal(unpack_rows(packed, n), mask)
    assert torch.equal(unpack_rows(packed[2:4], n), mask[2:4])


def test_layer_forward_and_gradients_with_dropout_float64():
    model, masks = pruned_tiny(dtype=torch.float64)
    peft_model = inject_sparse_lora(model, masks, r=4, alpha=12.0, dropout=0.3, dtype=torch.float64)
    randomize_b(peft_model)
    layer = dict(sparse_lora_layers(peft_model))[Q0]
    layer.train()
    w = layer.get_base_layer().weight
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert layer.scaling["default"] == 3.0
    x = torch.randn(3, 7, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    g = torch.randn(3, 7, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(11)
    y = layer(x)
    grads = torch.autograd.grad(y, (x, a, b), g)
    torch.manual_seed(11)
    xd = F.dropout(x, 0.3, training=True)  # the same dropout draw as the layer's
    assert not torch.equal(xd, x)
    expected = reference(x, w, a, b, masks[Q0], 3.0, xd)
    exp_grads = torch.autograd.grad(expected, (x, a, b), g)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, exp_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer.effective_weight(), w + 3.0 * (b @ a) * masks[Q0], rtol=1e-12, atol=1e-12)


def test_only_the_packed_mask_is_saved_for_backward():
    model, masks = pruned_tiny()
    peft_model = inject_sparse_lora(model, masks, dropout=0.1)
    layer = dict(sparse_lora_layers(peft_model))[Q0].train()
    w = layer.get_base_layer().weight
    m, n = w.shape
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    x = torch.randn(4, 32, n, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer(x)
    y.sum().backward()
    big = [t for t in saved if t.numel() >= m * n // 8]
    assert any(t.dtype == torch.uint8 and t.numel() == m * n // 8 for t in big)  # the packed mask, 1 bit/weight
    for t in big:  # nothing else of size m x n but the frozen weight itself (F.linear of the base layer)
        assert t.dtype == torch.uint8 or t.numel() != m * n or t.data_ptr() == w.data_ptr(), (t.dtype, t.shape)
    assert layer.mask_packed.numel() == m * n // 8
    assert not [k for k in layer.state_dict() if "mask" in k]  # not a state-dict entry (derived from W~)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_merge_equals_formula_and_keeps_zeros_bit_exactly(dtype):
    model, masks = pruned_tiny(dtype=dtype)
    before = {n: m.weight.detach().clone() for n, m in model.named_modules() if n in masks}
    assert any(bool(torch.signbit(w[w == 0]).any()) for w in before.values())  # some -0.0 to keep
    peft_model = inject_sparse_lora(model, masks)
    randomize_b(peft_model)
    layers = dict(sparse_lora_layers(peft_model))
    deltas = {n: (lay.lora_B["default"].weight @ lay.lora_A["default"].weight).detach() * lay.scaling["default"]
              for n, lay in layers.items()}
    plain, stats = merge_sparse_lora(peft_model)
    assert not isinstance(plain, PeftModel) and not list(sparse_lora_layers(plain))
    assert stats["layers"] == 14 and stats["pruned_nonzero"] == 0 and stats["delta_sq_norm"] > 0
    modules = dict(plain.named_modules())
    for name, w0 in before.items():
        merged = modules[name].weight.detach()
        keep = masks[name]
        bits = BITS[dtype]
        assert torch.equal(merged.view(bits)[~keep], w0.view(bits)[~keep])  # pruned: the same bits (±0.0)
        assert torch.equal(merged == 0, w0 == 0)  # the whole zero pattern
        expected = (w0.float() + deltas[name] * keep).to(dtype)
        assert torch.equal(merged[keep], expected[keep])


def test_registry_inject_trains_only_lora_and_merge_matches_unmerged():
    model, masks = pruned_tiny()
    cfg = adapter_cfg()
    assert cfg.name == "sparse_lora" and cfg.r == 8 and cfg.lora_alpha == 16.0
    assert not get_method("sparse_lora").kept_zeros_may_change
    wrapped, trainable = apply_adapter(model, cfg, masks)
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 14
    assert all(p.dtype == torch.float32 for n, p in wrapped.named_parameters() if p.requires_grad)
    randomize_b(wrapped)
    ids = torch.randint(4, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    wrapped.eval()
    with torch.no_grad():
        y = wrapped(input_ids=ids).logits
        effective = {n: lay.effective_weight() for n, lay in sparse_lora_layers(wrapped)}
    plain, _ = merge_adapter(wrapped, cfg, masks)
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, y, rtol=1e-4, atol=1e-4)
    for name, module in plain.named_modules():
        if name in effective:
            torch.testing.assert_close(module.weight, effective[name], rtol=0, atol=1e-6)


def test_training_lowers_the_loss_and_keeps_every_zero():
    model, masks = pruned_tiny()
    zeros = {n: m.weight.detach() == 0 for n, m in model.named_modules() if n in masks}
    peft_model = inject_sparse_lora(model, masks, r=4, dropout=0.0)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    ids = torch.randint(4, 200, (4, 16), generator=torch.Generator().manual_seed(0))
    peft_model.train()
    losses = []
    for _ in range(8):
        loss = peft_model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    for name, layer in sparse_lora_layers(peft_model):
        assert torch.equal(layer.effective_weight() == 0, zeros[name])
    plain, stats = merge_sparse_lora(peft_model)
    assert stats["pruned_nonzero"] == 0
    for name, module in plain.named_modules():
        if name in zeros:
            assert torch.equal(module.weight == 0, zeros[name])


def test_adapter_files_round_trip(tmp_path):
    model, masks = pruned_tiny()
    base = copy.deepcopy(model)
    peft_model = inject_sparse_lora(model, masks, r=4, alpha=8.0, dropout=0.05)
    randomize_b(peft_model)
    get_method("sparse_lora").save(peft_model, tmp_path, {"pruner": "test"})
    assert {"adapter_config.json", "adapter_model.safetensors", "sparse_lora.json"} <= {p.name for p in
                                                                                         tmp_path.iterdir()}
    loaded = load_sparse_lora(copy.deepcopy(base), tmp_path, masks)
    got = dict(sparse_lora_layers(loaded))
    for name, layer in sparse_lora_layers(peft_model):
        for key in ("lora_A", "lora_B"):
            assert torch.equal(getattr(got[name], key)["default"].weight, getattr(layer, key)["default"].weight)
        assert torch.equal(got[name].mask_packed, layer.mask_packed)
        assert got[name].scaling["default"] == layer.scaling["default"] == 2.0
    ids = torch.randint(4, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    peft_model.eval()
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, peft_model(input_ids=ids).logits)
    # a base pruned differently is refused
    other, _ = pruned_tiny(seed=5)
    with pytest.raises(ValueError, match="mask sizes differ"):
        load_sparse_lora(other, tmp_path)


def test_adapter_config_says_sparse_lora_and_old_lora_folders_still_load(tmp_path):
    """``adapter_config.json`` records ``"peft_type": "SPARSE_LORA"``; spp's loader (``adapter_dir=``) reads it and a
    folder written before (``"LORA"``) alike, and refuses another type in one line."""
    model, masks = pruned_tiny()
    peft_model = inject_sparse_lora(copy.deepcopy(model), masks, r=4)
    randomize_b(peft_model)
    new = save_sparse_lora(peft_model, tmp_path / "new")
    config = json.loads((new / "adapter_config.json").read_text())
    assert config["peft_type"] == "SPARSE_LORA"
    old, other = tmp_path / "old", tmp_path / "other"
    for folder, kind in ((old, "LORA"), (other, "SPP")):
        folder.mkdir()
        for f in new.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        (folder / "adapter_config.json").write_text(json.dumps({**config, "peft_type": kind}))
    ids = torch.randint(4, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = peft_model.eval()(input_ids=ids).logits
        for folder in (new, old):
            loaded, cfg = get_method("sparse_lora").load(copy.deepcopy(model), folder, masks)
            assert (cfg.r, cfg.lora_alpha) == (4, 16.0)
            assert torch.equal(loaded.eval()(input_ids=ids).logits, expected)
    with pytest.raises(ValueError, match=r"is not a SparsePEFT adapter \(peft_type='SPP'\)"):
        load_sparse_lora(copy.deepcopy(model), other)


def test_bad_masks_and_targets_are_refused():
    model, masks = pruned_tiny()
    with pytest.raises(ValueError, match="no pruning mask"):
        inject_sparse_lora(copy.deepcopy(model), {k: v for k, v in masks.items() if k != Q0})
    dense_mask = dict(masks, **{Q0: torch.ones_like(masks[Q0])})
    dense_mask[Q0][0, 0] = False
    with torch.no_grad():
        model.get_submodule(Q0).weight[0, 0] = 1.0
    with pytest.raises(ValueError, match="non-zero"):
        inject_sparse_lora(copy.deepcopy(model), dense_mask)
    with pytest.raises(ValueError, match="adapter.targets"):
        inject_sparse_lora(copy.deepcopy(model), masks, targets=("qkv",))


def test_kept_zero_weights_stay_zero():
    model, masks = pruned_tiny()
    with torch.no_grad():
        rows, cols = torch.nonzero(masks[Q0], as_tuple=True)
        model.get_submodule(Q0).weight[rows[:3], cols[:3]] = 0.0  # kept by the mask but exactly zero
    peft_model = inject_sparse_lora(model, masks)
    randomize_b(peft_model)
    layer = dict(sparse_lora_layers(peft_model))[Q0]
    assert int(layer.mask.sum()) == int(masks[Q0].sum()) - 3
    assert bool((layer.effective_weight()[rows[:3], cols[:3]] == 0).all())
    assert isinstance(layer, SparseLoraLinear)


def test_without_masks_the_weights_nonzeros_are_the_mask():
    model, masks = pruned_tiny()
    for given in (None, {}):
        peft_model = inject_sparse_lora(copy.deepcopy(model), given)
        for name, layer in sparse_lora_layers(peft_model):
            assert torch.equal(layer.mask, masks[name])


def test_bf16_autocast_and_bf16_base_train_with_fp32_factors():
    model, masks = pruned_tiny(dtype=torch.bfloat16)
    peft_model = inject_sparse_lora(model, masks, dropout=0.0)
    randomize_b(peft_model)
    layer = dict(sparse_lora_layers(peft_model))[Q0].train()
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert a.dtype == b.dtype == torch.float32
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x.bfloat16())
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and a.grad.dtype == b.grad.dtype == torch.float32
    w = layer.get_base_layer().weight.float()
    expected = x.bfloat16().float() @ (w + 2.0 * (b @ a).detach() * masks[Q0]).t()
    torch.testing.assert_close(y.float(), expected, rtol=0.05, atol=0.05)
    xs = x.bfloat16().float()
    torch.testing.assert_close(b.grad, 2.0 * ((torch.ones(6, 64).t() @ xs) * masks[Q0]) @ a.detach().t(),
                               rtol=0.05, atol=0.05)
