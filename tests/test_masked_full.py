"""Masked full fine-tuning (adapter=masked_full): gradient dL/dW ⊙ M in float64, pruned weights exactly zero after
AdamW with weight decay, AdamW states only for the adapted projections, merge = identity, memory estimate/refusal."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import spp.adapters.methods.masked_full.masked_full as mf
from spp.adapters.config import AdapterConfig
from spp.adapters.methods.masked_full.masked_full import (
    MASK_BUFFER,
    estimate_training_memory,
    inject_masked_full,
    kept_parameters,
    masked_full_layers,
    merge_masked_full,
)
from spp.adapters.registry import apply_adapter, get_method, merge_adapter, option_config
from spp.models import tiny_llama
from spp.projections import DEFAULT_TARGETS

Q0 = "model.layers.0.self_attn.q_proj"


def pruned_tiny(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """Tiny LLaMA with random 50 % masks (True = kept) on the 7 projections."""
    model = tiny_llama(seed=seed, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    masks = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in DEFAULT_TARGETS:
                mask = torch.rand(module.weight.shape, generator=gen) < 0.5
                module.weight.mul_(mask)
                masks[name] = mask
    return model, masks


def adapter_cfg() -> AdapterConfig:
    """The shipped ``conf/adapter/masked_full.yaml`` as the typed config."""
    return option_config("masked_full")


def test_only_projection_weights_train_and_adamw_holds_states_only_for_them():
    model, masks = pruned_tiny()
    model, trainable = apply_adapter(model, adapter_cfg(), masks)
    assert sorted(trainable) == sorted(f"{n}.weight" for n in masks)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    ids = torch.randint(4, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    owners = {id(p): n for n, p in model.named_parameters()}
    assert sorted(owners[id(p)] for p in opt.state) == sorted(trainable)
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)


def test_weight_gradient_is_the_dense_gradient_times_the_mask_float64():
    model, masks = pruned_tiny(dtype=torch.float64)
    inject_masked_full(model, masks)
    layer = model.get_submodule(Q0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=gen, dtype=torch.float64)
    g = torch.randn(3, 5, 64, generator=gen, dtype=torch.float64)
    y = layer(x)
    torch.testing.assert_close(y, x @ layer.weight.detach().t(), rtol=1e-12, atol=1e-12)
    y.backward(g)
    dense = g.reshape(-1, 64).t() @ x.reshape(-1, 64)  # dL/dW of y = x Wᵀ
    assert torch.equal(layer.weight.grad, dense * masks[Q0])  # masked entries exactly 0, kept ones untouched
    assert bool((layer.weight.grad[~masks[Q0]] == 0).all()) and bool((layer.weight.grad[masks[Q0]] != 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pruned_weights_stay_exactly_zero_after_adamw_with_weight_decay(dtype):
    model, masks = pruned_tiny(dtype=dtype)
    before = {n: model.get_submodule(n).weight.detach().clone() for n in masks}
    inject_masked_full(model, masks)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.5)
    ids = torch.randint(4, 200, (4, 16), generator=torch.Generator().manual_seed(0))
    model.train()
    losses = []
    for _ in range(6):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    for name, mask in masks.items():
        w = model.get_submodule(name).weight.detach()
        assert bool((w[~mask] == 0).all()), name
        assert torch.equal(w == 0, before[name] == 0), name  # the zero pattern did not move
        assert not torch.equal(w[mask], before[name][mask])  # kept weights trained
    merged, stats = merge_adapter(model, adapter_cfg(), masks)
    assert merged is model and stats["pruned_nonzero"] == 0


def test_merge_is_the_identity_and_removes_hooks_and_masks():
    model, masks = pruned_tiny()
    inject_masked_full(model, masks)
    assert kept_parameters(model) == sum(int(m.sum()) for m in masks.values())
    weights = {n: model.get_submodule(n).weight.detach().clone() for n in masks}
    merged, stats = merge_masked_full(model)
    assert merged is model and not masked_full_layers(model)
    assert stats == {"layers": 14, "kept_params": sum(int(m.sum()) for m in masks.values()),
                     "trainable_params": sum(m.numel() for m in masks.values()), "pruned_nonzero": 0}
    assert not any(p.requires_grad for p in model.parameters())
    assert not any(n.endswith(MASK_BUFFER) for n, _ in model.named_buffers())
    for name, w in weights.items():
        assert torch.equal(model.get_submodule(name).weight, w)
    layer = model.get_submodule(Q0)
    layer.weight.requires_grad_(True)
    layer(torch.ones(1, 64)).sum().backward()
    assert bool((layer.weight.grad[~masks[Q0]] != 0).any())  # the hook is gone


def test_memory_estimate_counts_weights_grads_and_adamw_states():
    model, masks = pruned_tiny()
    inject_masked_full(model, masks)
    est = estimate_training_memory(model, available_bytes=10**12)
    proj = sum(m.numel() for m in masks.values())
    everything = sum(p.numel() for p in model.parameters())
    assert est.trainable_params == proj
    assert (est.weight_bytes, est.grad_bytes, est.optimizer_bytes) == (4 * everything, 4 * proj, 8 * proj)
    assert est.mask_bytes == sum(m.shape[0] * m.shape[1] // 8 for m in masks.values())
    assert est.total_bytes == 4 * everything + 12 * proj + est.mask_bytes and est.fits
    assert est.to_dict()["device"] == "cpu" and est.to_dict()["total_gib"] == est.total_bytes / 2**30


def test_refuses_clearly_when_it_does_not_fit(monkeypatch):
    model, masks = pruned_tiny()
    with pytest.raises(MemoryError, match=r"adapter.name=masked_full needs .* GiB .* cpu has 0.00 GiB free"):
        inject_masked_full(copy.deepcopy(model), masks, available_bytes=1000)
    monkeypatch.setattr(mf, "available_memory", lambda device: 1000)
    with pytest.raises(MemoryError, match="adapter.name=masked_full"):
        apply_adapter(model, adapter_cfg(), masks)
    assert all(p.requires_grad for p in model.parameters())  # refused before anything was frozen or hooked
    assert not masked_full_layers(model)


def test_bad_masks_and_targets_are_refused():
    model, masks = pruned_tiny()
    with pytest.raises(ValueError, match="no pruning mask"):
        inject_masked_full(copy.deepcopy(model), {k: v for k, v in masks.items() if k != Q0})
    with pytest.raises(ValueError, match="adapter.targets"):
        inject_masked_full(copy.deepcopy(model), masks, targets=("qkv",))
    with torch.no_grad():
        model.get_submodule(Q0).weight[~masks[Q0]] = 1.0
    with pytest.raises(ValueError, match="non-zero"):
        inject_masked_full(model, masks)


def test_save_writes_the_layer_summary(tmp_path):
    model, masks = pruned_tiny()
    inject_masked_full(model, masks)
    method = get_method("masked_full")
    assert method.trains and not method.kept_zeros_may_change
    assert method.trained_parameters(model) == sum(int(m.sum()) for m in masks.values())
    assert estimate_training_memory(model).trainable_params == sum(m.numel() for m in masks.values())
    method.save(model, tmp_path, {"pruner": "test"})
    meta = json.loads((tmp_path / "masked_full.json").read_text())
    assert meta["format"] == "masked_full" and meta["extra"] == {"pruner": "test"}
    assert meta["layers"][Q0] == int(masks[Q0].sum()) and meta["memory"]["trainable_params"] > 0


def test_without_masks_the_weights_nonzeros_are_the_mask():
    model, masks = pruned_tiny()
    inject_masked_full(model, {})
    for name, module in masked_full_layers(model).items():
        assert torch.equal(mf.unpack_rows(getattr(module, MASK_BUFFER), module.in_features), masks[name])
