"""``adapter=norms`` (PERP's retraining baseline): exactly the normalisation weights and the target linears' biases
train, no linear weight moves (zeros audited before and after the merge), the merge is the identity, its files round
trip bit-exactly and ``eval.py adapter_dir=``'s loader gives the trained model; Table 1 counts the norm weights, and
so does ``train.py plan=true adapter=norms`` (the plan asks the method)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

from lab.table1_params import count_method_parameters, model_arch
from spp.adapters import apply_adapter, get_method, make_config
from spp.adapters.methods.norms.method import is_norm, load_norms, norm_parameters
from spp.adapters.registry import load_adapter_dir, save_adapter_dir
from spp.errors import UserError
from spp.models.tiny import tiny_llama
from spp.paths import REPO_ROOT
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model
from spp.training.callbacks.sparsity_audit import audit, effective_weights


def _pruned(model=None):
    model = model if model is not None else tiny_llama(seed=0)
    masks = prune_model(model, None, PrunerConfig(name="magnitude"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                        device="cpu").masks
    return model, masks


def _train(model, steps: int = 3) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(4, 200, (2, 16), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()


def test_only_norm_weights_train_and_every_zero_is_kept():
    pruned, masks = _pruned()
    zeros = {k: (w == 0).cpu() for k, w in effective_weights(pruned, set(masks))}  # the exact zeros now
    model, trainable = apply_adapter(copy.deepcopy(pruned), make_config("norms"), masks)
    assert trainable == [n for n, _ in model.named_parameters() if n.endswith("norm.weight")] and len(trainable) == 5
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 5 * 64
    _train(model)
    before = dict(pruned.named_parameters())
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == set(trainable)  # the norms moved, nothing else did
    assert audit(model, masks, zeros, when="trained")["sparsity"] == 0.5
    merged, stats = get_method("norms").merge(model, make_config("norms"), masks)
    assert stats == {} and not any(p.requires_grad for p in merged.parameters())
    assert audit(merged, masks, zeros, when="merged")["layers"] == 14


def test_target_biases_train_too():
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         vocab_size=64, attention_bias=True, mlp_bias=True)
    model = LlamaForCausalLM(config)
    model, trainable = apply_adapter(model, make_config("norms", targets=["q_proj", "v_proj"]), {})
    biases = sorted(n for n in trainable if n.endswith("bias"))
    assert biases == ["model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"]
    assert all(is_norm(model.get_submodule(n.rsplit(".", 1)[0])) for n in trainable if n.endswith("weight"))
    assert set(norm_parameters(model, ["q_proj", "v_proj"])) == set(trainable)



def test_a_target_naming_no_projection_is_refused_as_by_every_method():
    """A misspelt ``adapter.targets`` entry is one line naming the key, not a run without those biases (Qwen2's q/k/v
    biases); the right name trains them (control)."""
    model = tiny_llama(model_type="qwen2")
    with pytest.raises(UserError, match=r"adapter.targets: 'q_prj' matches no module"):
        apply_adapter(model, make_config("norms", targets=["q_prj"]), {})
    _, trainable = apply_adapter(tiny_llama(model_type="qwen2"), make_config("norms", targets=["q_proj"]), {})
    assert sorted(n for n in trainable if n.endswith("proj.bias")) == [f"model.layers.{i}.self_attn.q_proj.bias"
                                                                       for i in range(2)]

def test_recorded_targets_name_the_linears_not_the_layer_norms(tmp_path):
    """OPT's LayerNorms have biases too: ``norms.json``'s ``targets`` names only the linears whose biases train."""
    config = OPTConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
                       max_position_embeddings=32, word_embed_proj_dim=16)
    model, _ = apply_adapter(OPTForCausalLM(config), make_config("norms"), {})
    assert any(n.endswith("layer_norm.bias") for n, p in model.named_parameters() if p.requires_grad)
    get_method("norms").save(model, tmp_path, {})
    targets = json.loads((tmp_path / "norms.json").read_text())["targets"]
    assert targets == ["fc1", "fc2", "k_proj", "out_proj", "q_proj", "v_proj"]
    assert load_norms(OPTForCausalLM(config), tmp_path)[1] == targets


def test_files_round_trip_and_the_loader_gives_the_trained_model(tmp_path):
    pruned, masks = _pruned()
    cfg = make_config("norms")
    model, _ = apply_adapter(copy.deepcopy(pruned), cfg, masks)
    _train(model)
    save_adapter_dir(get_method("norms"), model, tmp_path / "adapter", {"pruner": "magnitude"}, cfg)
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "adapter_method.json", "adapter_model.safetensors", "norms.json"]
    loaded, targets = load_norms(copy.deepcopy(pruned), tmp_path / "adapter")
    assert targets == list(cfg.targets)
    merged, info = load_adapter_dir(copy.deepcopy(pruned), tmp_path / "adapter", masks)
    assert info == {"method": "norms", "r": None, "merge": {}}
    trained = dict(model.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in merged.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in loaded.named_parameters())
    (tmp_path / "other").mkdir()
    with pytest.raises(UserError, match="no norms.json") as err:
        get_method("norms").load(copy.deepcopy(pruned), tmp_path / "other", masks)
    assert err.value.key == "adapter_dir"


@pytest.mark.parametrize(("name", "expected"), [("llama7b", 4096 * (2 * 32 + 1)), ("smollm2_135m", 576 * (2 * 30 + 1))])
def test_table1_counts_the_norm_weights(name, expected):
    row = count_method_parameters(name, "norms")
    assert row.trainable == expected and row.r == 0
    if name == "smollm2_135m":  # small enough to build: the total is every parameter of the model
        assert row.total == sum(p.numel() for p in LlamaForCausalLM(model_arch(name)).parameters())
    else:
        assert row.total > 6e9


def test_plan_of_norms_counts_the_model_norm_weights(tmp_path):
    """``train.py experiment=tiny_smoke adapter=norms plan=true``: the plan's trainable count is the tiny model's
    norm weights counted here (a plan that models adapters by name planned 0)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("SPP_PLUGINS", None)
    proc = subprocess.run([sys.executable, "train.py", "experiment=tiny_smoke", "adapter=norms", "plan=true",
                           "plan_json=-", f"hydra.run.dir={tmp_path}"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout[proc.stdout.index("{"):])
    norms = sum(p.numel() for m in tiny_llama(seed=0).modules() if type(m).__name__.endswith("RMSNorm")
                for p in m.parameters(recurse=False))
    assert plan["adapter"] == "norms" and plan["trainable_params"] == norms > 0
    assert plan["optimizer"]["adapter"] == 0  # it trains the model's own tensors: nothing is added to the model
