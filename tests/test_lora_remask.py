"""LoRA* baseline: peft LoRA on a pruned model, merge, re-mask — zeros, removed fraction, outputs."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import PeftModel

from spp.adapters.methods.lora.remask import (
    LORA_TARGETS,
    inject_lora,
    lora_layers,
    merge_and_remask,
)
from spp.models import tiny_llama
from spp.projections import current_masks

Q0 = "model.layers.0.self_attn.q_proj"


def pruned_tiny(seed: int = 0) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """Tiny LLaMA whose 7 projections are pruned by random 50 % masks (kept = True)."""
    model = tiny_llama(seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    masks: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in LORA_TARGETS:
                mask = torch.rand(module.weight.shape, generator=generator) < 0.5
                module.weight.mul_(mask)
                masks[name] = mask
    return model, masks


def randomize_lora(model: PeftModel, seed: int = 0) -> None:
    """Give every LoRA B a non-zero value (peft starts B at zero, i.e. ΔW = 0)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=generator) * 0.1)


def test_inject_lora_trains_only_the_adapters() -> None:
    model, _ = pruned_tiny()
    peft_model = inject_lora(model)
    trainable = {n: p.numel() for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    expected = sum(8 * (layer.in_features + layer.out_features) for _, layer in lora_layers(peft_model))
    assert len(dict(lora_layers(peft_model))) == 14
    assert sum(trainable.values()) == expected == 16384  # per layer r·(m+n): 8·(4·128 + 2·96 + 3·192) · 2
    (layer,) = [m for n, m in lora_layers(peft_model) if n == Q0]
    assert layer.scaling["default"] == 2.0
    assert layer.lora_dropout["default"].p == 0.05


def test_remasked_zeros_equal_mask_and_outputs_equal_manual_formula() -> None:
    model, masks = pruned_tiny()
    peft_model = inject_lora(model)
    randomize_lora(peft_model)
    manual = {}
    for name, layer in lora_layers(peft_model):
        w = layer.get_base_layer().weight.detach().clone()
        a, b = layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach()
        manual[name] = (w + layer.scaling["default"] * (b @ a)) * masks[name]
    reference = tiny_llama(seed=0)
    state = reference.state_dict()
    state.update({f"{name}.weight": weight for name, weight in manual.items()})
    reference.load_state_dict(state)

    plain, stats = merge_and_remask(peft_model, masks)
    assert not isinstance(plain, PeftModel)
    modules = dict(plain.named_modules())
    for name, mask in masks.items():
        weight = modules[name].weight
        assert torch.equal(weight != 0, mask), name
        torch.testing.assert_close(weight, manual[name], rtol=0, atol=1e-6)
    ids = torch.randint(4, 260, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(ids).logits, reference.eval()(ids).logits, rtol=1e-5, atol=1e-5)
    assert stats.pruned_entries == sum(int((~m).sum()) for m in masks.values())
    assert stats.pruned_made_nonzero == stats.pruned_entries  # a dense random ΔW touches every pruned entry


def test_removed_fraction_matches_an_independent_merge() -> None:
    model, masks = pruned_tiny(seed=5)
    peft_model = inject_lora(model)
    randomize_lora(peft_model, seed=7)
    pruned = {n: m.get_base_layer().weight.detach().clone() for n, m in lora_layers(peft_model)}
    plain_merge = dict(copy.deepcopy(peft_model).merge_and_unload().named_modules())
    removed_total = delta_total = 0.0
    _, stats = merge_and_remask(peft_model, masks)
    per_layer = {s.name: s for s in stats.layers}
    for name, mask in masks.items():
        delta = plain_merge[name].weight.detach().double() - pruned[name].double()
        removed, full = float(delta[~mask].square().sum()), float(delta.square().sum())
        removed_total, delta_total = removed_total + removed, delta_total + full
        assert per_layer[name].removed_fraction == pytest.approx(removed / full, rel=1e-5)
        assert per_layer[name].pruned_made_nonzero == int((plain_merge[name].weight[~mask] != 0).sum())
    assert stats.removed_fraction == pytest.approx(removed_total / delta_total, rel=1e-5)
    assert 0.4 < stats.removed_fraction < 0.6  # random ΔW, half the entries pruned
    assert stats.to_dict()["removed_fraction"] == stats.removed_fraction and len(stats.to_dict()["layers"]) == 14


def test_hand_computed_removed_fraction() -> None:
    """ΔW = 2·b aᵀ on one layer with b = (1, 2, 0, …), a = (1, 1, 1, 1, 0, …); half of its support pruned."""
    model, masks = pruned_tiny()
    peft_model = inject_lora(model)  # B = 0 everywhere: ΔW = 0 except where set below
    masks[Q0] = torch.ones_like(masks[Q0])
    masks[Q0][0, :2] = False  # ΔW there: 2·1·1 = 2 each
    masks[Q0][1, 2:4] = False  # ΔW there: 2·2·1 = 4 each
    masks[Q0][5, 7] = False  # ΔW = 0 there
    with torch.no_grad():
        (layer,) = [m for n, m in lora_layers(peft_model) if n == Q0]
        layer.get_base_layer().weight.mul_(masks[Q0])
        layer.lora_A["default"].weight.zero_()
        layer.lora_A["default"].weight[0, :4] = 1.0
        layer.lora_B["default"].weight[:2, 0] = torch.tensor([1.0, 2.0])
    _, stats = merge_and_remask(peft_model, masks)
    q0 = next(s for s in stats.layers if s.name == Q0)
    assert q0.delta_sq_norm == pytest.approx(4 * 4 + 4 * 16)  # row 0: four 2s; row 1: four 4s
    assert q0.removed_sq_norm == pytest.approx(2 * 4 + 2 * 16)
    assert q0.removed_fraction == pytest.approx(0.5)
    assert (q0.pruned_entries, q0.pruned_made_nonzero) == (5, 4)
    assert stats.removed_fraction == pytest.approx(0.5)
    assert all(s.delta_sq_norm == 0 and s.pruned_made_nonzero == 0 for s in stats.layers if s.name != Q0)


def test_lora_training_then_remask_keeps_the_pattern() -> None:
    model, masks = pruned_tiny()
    assert all(torch.equal(current_masks(model)[n], m) for n, m in masks.items())
    peft_model = inject_lora(model, dropout=0.0)
    peft_model.train()
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(4, 260, (4, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(8):
        loss = peft_model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05
    plain, stats = merge_and_remask(peft_model, masks)
    after = current_masks(plain)
    assert all(torch.equal(after[n], m) for n, m in masks.items())
    assert 0.0 < stats.removed_fraction < 1.0 and stats.pruned_made_nonzero > 0


def test_bad_targets_and_masks_fail_with_named_problem() -> None:
    model, masks = pruned_tiny()
    with pytest.raises(ValueError, match=r"adapter.targets: 'qproj' matches no module"):
        inject_lora(tiny_llama(), targets=("qproj", "v_proj"))
    peft_model = inject_lora(model)
    partial = {n: m for n, m in masks.items() if n != Q0}
    with pytest.raises(ValueError, match=r"without a mask: \['model.layers.0.self_attn.q_proj'\]"):
        merge_and_remask(peft_model, partial)
    with pytest.raises(ValueError, match=r"q_proj' has shape \(64, 32\)"):
        merge_and_remask(peft_model, {**masks, Q0: masks[Q0][:, :32]})


def test_stats_convert_to_a_json_mapping() -> None:
    import json

    model, masks = pruned_tiny()
    peft_model = inject_lora(model)
    randomize_lora(peft_model)
    _, stats = merge_and_remask(peft_model, masks)
    as_dict = stats.to_dict()
    assert set(as_dict) >= {"removed_fraction", "pruned_made_nonzero", "layers"}
    assert json.loads(json.dumps(as_dict))["pruned_entries"] == stats.pruned_entries


@pytest.mark.parametrize("dtype", ["bfloat16", "float64"])
def test_adapter_dtype_sets_the_lora_factors_dtype_as_for_every_lora_shaped_method(dtype):
    """``adapter.dtype`` is the trained tensors' dtype for LoRA* as for SparsePEFT (peft alone keeps LoRA in fp32)."""
    from spp.adapters.registry import apply_adapter, option_config

    factors = {}
    for name in ("lora", "sparse_lora"):
        model, masks = pruned_tiny()
        model, trainable = apply_adapter(model, option_config(name, dtype=dtype, r=4), masks)
        params = dict(model.named_parameters())
        factors[name] = {str(params[n].dtype) for n in trainable}
    assert factors == {"lora": {f"torch.{dtype}"}, "sparse_lora": {f"torch.{dtype}"}}


@pytest.mark.parametrize("dtype", ["bfloat16", "float64"])
def test_adapter_dir_of_a_lora_run_in_another_dtype_loads_to_the_runs_own_merge(dtype, tmp_path):
    """``eval.py adapter_dir=`` (``load_adapter_dir``) of an ``adapter.dtype=bfloat16|float64`` LoRA* folder merges to
    the weights the run's export merged, bit for bit: the factors keep the file's dtype (peft would load them fp32)."""
    from spp.adapters.registry import apply_adapter, get_method, load_adapter_dir, option_config, save_adapter_dir

    cfg = option_config("lora", dtype=dtype, r=4)
    model, masks = pruned_tiny()
    model, _ = apply_adapter(model, cfg, masks)
    randomize_lora(model)
    save_adapter_dir(get_method("lora"), model, tmp_path, {}, cfg)
    expected = get_method("lora").merge(model, cfg, masks)[0].state_dict()
    loaded = load_adapter_dir(pruned_tiny()[0], tmp_path, masks)[0].state_dict()
    assert [n for n, t in loaded.items() if not torch.equal(t, expected[n])] == []
