"""inject / merge_and_unload on a tiny HF LLaMA: what is replaced, what trains, zeros and logits after reload."""

from __future__ import annotations

import pytest
import torch
from spp_helpers import prune_2_4_
from torch import nn
from transformers import AutoModelForCausalLM

from spp import SPPLinear, count_parameters, inject, merge_and_unload, set_impl, spp_layers
from spp.models.tiny import tiny_llama

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_inject_replaces_targets_and_freezes_rest(tiny_model):
    ids = torch.randint(0, 260, (2, 12), generator=torch.Generator().manual_seed(0))
    before = tiny_model(ids).logits
    shapes = {n: tuple(m.weight.shape) for n, m in tiny_model.named_modules() if isinstance(m, nn.Linear)}
    inject(tiny_model, r=16, dropout=0.0)
    layers = spp_layers(tiny_model)
    assert len(layers) == 2 * 7
    assert {n.rsplit(".", 1)[-1] for n in layers} == set(TARGETS)
    assert isinstance(tiny_model.lm_head, nn.Linear) and not isinstance(tiny_model.lm_head, SPPLinear)
    trainable = {n for n, p in tiny_model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.spp_alpha" for n in layers} | {f"{n}.spp_beta" for n in layers}
    # m + r n per adapted matrix (paper Sec. 3.2)
    expected = sum(shapes[n][0] + 16 * shapes[n][1] for n in layers)
    assert count_parameters(tiny_model)[0] == expected
    assert all(layers[n].name == n and layers[n].base.weight.shape == shapes[n] for n in layers)
    torch.testing.assert_close(tiny_model(ids).logits, before, rtol=0, atol=0)  # beta = 0: pruned model


def test_inject_errors(tiny_model):
    with pytest.raises(ValueError, match=r"'query' matches no module .*\['q_proj', 'k_proj', 'v_proj', 'o_proj'"):
        inject(tiny_model, targets=("query",))
    with pytest.raises(ValueError, match=r"k_proj: r=3 does not divide out_features=32"):
        inject(tiny_model, targets=("k_proj",), r=3)
    inject(tiny_model, targets=("v_proj",))
    with pytest.raises(ValueError, match="already holds SPPLinear"):
        inject(tiny_model)
    with pytest.raises(ValueError, match="unknown impl"):
        set_impl(tiny_model, "gpu")


def test_training_lowers_loss_and_keeps_zeros(tiny_model):
    zeros = prune_2_4_(tiny_model)
    inject(tiny_model, r=8, dropout=0.05)
    tiny_model.train()
    ids = torch.randint(0, 260, (4, 16), generator=torch.Generator().manual_seed(1))
    params = [p for p in tiny_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-1)
    torch.manual_seed(0)
    losses = []
    for _ in range(20):
        loss = tiny_model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.5
    merge_and_unload(tiny_model)
    for name, z in zeros.items():
        assert torch.equal(tiny_model.get_submodule(name).weight == 0, z)


def test_merge_and_unload_save_pretrained_round_trip(tmp_path):
    model = tiny_llama(seed=0)
    zeros = prune_2_4_(model)
    inject(model, r=16)
    with torch.no_grad():
        for layer in spp_layers(model).values():
            layer.spp_beta.normal_(std=0.5)
    model.eval()
    ids = torch.randint(0, 260, (2, 10), generator=torch.Generator().manual_seed(2))
    logits_adapter = model(ids).logits
    merge_and_unload(model)
    assert spp_layers(model) == {}
    assert all(type(m) is nn.Linear for n, m in model.named_modules() if n.endswith("_proj"))
    logits_merged = model(ids).logits
    torch.testing.assert_close(logits_merged, logits_adapter, rtol=1e-4, atol=1e-4)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for name, z in zeros.items():
        assert torch.equal(reloaded.get_submodule(name).weight == 0, z)
    torch.testing.assert_close(reloaded(ids).logits, logits_merged, rtol=0, atol=0)
    with pytest.raises(ValueError, match="no SPPLinear"):
        merge_and_unload(reloaded)
