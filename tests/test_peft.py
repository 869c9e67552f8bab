"""SPP as a registered peft method (``spp.peft``): trains as ``spp.inject``, reads train.py's adapter folders, merges
keeping every zero; the example of ``docs/peft.md`` runs."""

from __future__ import annotations

import copy
import importlib
import json
import re
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, PeftType, get_peft_model
from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
from safetensors.torch import load_file
from torch import nn

import spp.peft
from spp.adapters.methods.sparse_lora.layer import inject_sparse_lora, load_sparse_lora, save_sparse_lora
from spp.adapters.methods.spp.config import SPPConfig as PaperSPPConfig
from spp.adapters.methods.spp.model import inject, merge_and_unload, spp_layers
from spp.adapters.registry import get_method, load_adapter_dir, masks_from_weights, save_adapter_dir
from spp.models.tiny import tiny_llama
from spp.paths import REPO_ROOT
from spp.peft import SPPConfig, SPPLayer, SPPModel, from_spp_adapter
from spp.peft.registration import register
from spp.projections import DEFAULT_TARGETS, matches

STEPS = 3
IDS = torch.randint(4, 260, (2, 16), generator=torch.Generator().manual_seed(1))


def pruned(seed: int = 0) -> nn.Module:
    """A tiny LLaMA whose seven projections have their smaller-magnitude half set to zero (a 50% pruned model)."""
    model = tiny_llama(seed=seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and matches(name, DEFAULT_TARGETS):
                w = module.weight
                w.masked_fill_(w.abs() <= w.abs().flatten().kthvalue(w.numel() // 2).values, 0.0)
    return model


def zero_patterns(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.weight == 0 for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and matches(n, DEFAULT_TARGETS)}


def train(model: nn.Module, steps: int = STEPS) -> list[float]:
    """``steps`` AdamW steps on a fixed batch (train mode: adapter dropout on), the RNG seeded first."""
    model.train()
    torch.manual_seed(7)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=IDS, labels=IDS).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def peft_tensors(model: PeftModel) -> dict[str, torch.Tensor]:
    """``{<module path>.spp_alpha / .spp_beta: tensor}`` of a peft SPP model (spp's own names)."""
    out = {}
    for name, layer in model.base_model.model.named_modules():
        if isinstance(layer, SPPLayer):
            out[f"{name}.spp_alpha"] = layer.spp_alpha["default"].detach()
            out[f"{name}.spp_beta"] = layer.spp_beta["default"].detach()
    return out


def spp_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{n}.{k}": getattr(layer, k).detach() for n, layer in spp_layers(model).items()
            for k in ("spp_alpha", "spp_beta")}


@pytest.fixture(scope="module")
def trained_pair():
    """The same pruned model adapted by ``peft.get_peft_model(SPPConfig(r=16))`` and by ``spp.inject(r=16)`` from the
    same seed, both trained ``STEPS`` AdamW steps; with their initial tensors and losses."""
    torch.manual_seed(0)
    peft_model = get_peft_model(pruned(), SPPConfig(r=16))
    torch.manual_seed(0)
    ref = inject(pruned(), r=16)
    init = (copy.deepcopy(peft_tensors(peft_model)), copy.deepcopy(spp_tensors(ref)))
    return peft_model, ref, init, train(peft_model), train(ref)


def test_defaults_are_the_papers_and_peft_knows_spp():
    cfg = SPPConfig()
    paper = PaperSPPConfig()
    assert cfg.target_modules == list(DEFAULT_TARGETS)
    assert cfg.layer_kwargs() == {"r": 16, "scale": 2.0, "dropout": 0.05, "alpha_init": "kaiming",
                                  "beta_init": "zeros", "use_beta": True, "impl": "fused", "residual": True}
    assert cfg.layer_kwargs() == {k: v if isinstance(v, (bool, int, float)) else str(v)
                                  for k, v in vars(paper).items() if k in cfg.layer_kwargs()}
    assert cfg.peft_type is PeftType.SPP and PeftType("SPP") is PeftType.SPP and "SPP" in list(PeftType)
    assert PEFT_TYPE_TO_CONFIG_MAPPING["SPP"] is SPPConfig and PEFT_TYPE_TO_TUNER_MAPPING["SPP"] is SPPModel


def test_registration_is_idempotent():
    register(SPPConfig, SPPModel)
    importlib.reload(spp.peft)  # the package's import registers again: a no-op
    assert PEFT_TYPE_TO_TUNER_MAPPING[PeftType.SPP] is SPPModel
    # the same classes re-created by a re-imported module replace the old ones; a foreign 'spp' method is refused
    again = type("SPPModel", (SPPModel,), {"__module__": SPPModel.__module__})
    try:
        register(SPPConfig, again)
        assert PEFT_TYPE_TO_TUNER_MAPPING[PeftType.SPP] is again
        with pytest.raises(RuntimeError, match="already has a method named 'spp'"):
            register(SPPConfig, type("Other", (SPPModel,), {"__module__": "elsewhere"}))
    finally:
        register(SPPConfig, SPPModel)
    assert PEFT_TYPE_TO_TUNER_MAPPING[PeftType.SPP] is SPPModel and PEFT_TYPE_TO_CONFIG_MAPPING["SPP"] is SPPConfig


def test_get_peft_model_trains_exactly_as_inject(trained_pair):
    """Point 1: same init and, after AdamW steps with dropout on, the same alpha and beta as ``spp.inject``."""
    peft_model, ref, (init_peft, init_ref), losses_peft, losses_ref = trained_pair
    assert list(init_peft) == list(init_ref) and len(init_peft) == 2 * 7 * 2
    for key, value in init_peft.items():
        assert torch.equal(value, init_ref[key]), key
    assert losses_peft == pytest.approx(losses_ref, abs=1e-6) and losses_peft[-1] < losses_peft[0]
    trained, reference = peft_tensors(peft_model), spp_tensors(ref)
    for key, value in trained.items():
        assert not torch.equal(value, init_peft[key]), f"{key} did not train"
        torch.testing.assert_close(value, reference[key], rtol=0, atol=1e-6, msg=key)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert len(trainable) == 28 and all(re.search(r"\.spp_(alpha|beta)\.default$", n) for n in trainable)


def test_merge_and_unload_keeps_zeros_and_equals_spp_merge(trained_pair):
    """Point 3: the merge keeps the zero pattern bit for bit and equals spp's own merge."""
    peft_model, ref, *_ = trained_pair
    peft_model, ref = copy.deepcopy(peft_model), copy.deepcopy(ref)
    before = zero_patterns(pruned())
    assert all(z.float().mean() >= 0.5 for z in before.values())
    weights_before = {n: m.weight.detach().clone() for n, m in pruned().named_modules() if n in before}
    layer = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    w = layer.get_base_layer().weight.detach().clone()
    peft_model.merge_adapter()  # and back, bit for bit
    assert not torch.equal(layer.get_base_layer().weight, w)
    peft_model.unmerge_adapter()
    assert torch.equal(layer.get_base_layer().weight, w)

    merged, own = peft_model.merge_and_unload(), merge_and_unload(ref)
    assert not any(isinstance(m, SPPLayer) for m in merged.modules())
    assert zero_patterns(merged).keys() == before.keys()
    for name, zeros in zero_patterns(merged).items():
        assert torch.equal(zeros, before[name]), name
        merged_w, own_w = merged.get_submodule(name).weight, own.get_submodule(name).weight
        assert not torch.equal(merged_w, weights_before[name]), f"{name}: the merge changed nothing"
        torch.testing.assert_close(merged_w, own_w, rtol=0, atol=1e-6, msg=name)


def test_from_pretrained_reads_a_train_py_adapter_dir(tmp_path):
    """Point 2: ``PeftModel.from_pretrained`` on the folder train.py writes (``save_adapter_dir``, the function of
    ``spp.training.finalize.save_adapter_files``) gives the logits of ``eval.py adapter_dir=``
    (``load_adapter_dir``)."""
    model = inject(pruned(), r=16, dtype=torch.float32)  # as adapter=spp's inject
    train(model, steps=2)
    run = tmp_path / "adapter"
    save_adapter_dir(get_method("spp"), model, run, {"pruning": {"pruner": "magnitude"}}, PaperSPPConfig())
    assert json.loads((run / "adapter_config.json").read_text())["peft_type"] == "SPP"

    own, _ = load_adapter_dir(pruned(), run, masks_from_weights(pruned()))
    expected = own.eval()(IDS).logits
    loaded = PeftModel.from_pretrained(pruned(), str(run)).eval()
    assert isinstance(loaded.peft_config["default"], SPPConfig) and loaded.peft_config["default"].r == 16
    with torch.no_grad():
        got = loaded(input_ids=IDS).logits
        plain = pruned()(IDS).logits
    assert not torch.allclose(expected, plain, atol=1e-3), "the adapter does nothing: the test would prove nothing"
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert not any(p.requires_grad for p in loaded.parameters())

    # a folder written before save_adapter recorded peft_type: spp.peft.from_spp_adapter reads it
    old = tmp_path / "old"
    old.mkdir()
    config = json.loads((run / "adapter_config.json").read_text())
    del config["peft_type"]
    (old / "adapter_config.json").write_text(json.dumps(config))
    (old / "adapter_model.safetensors").write_bytes((run / "adapter_model.safetensors").read_bytes())
    with pytest.raises(KeyError, match="peft_type"):
        PeftModel.from_pretrained(pruned(), str(old))
    with torch.no_grad():
        torch.testing.assert_close(from_spp_adapter(pruned(), old).eval()(input_ids=IDS).logits, expected,
                                   rtol=0, atol=1e-5)

    # peft's own save_pretrained round trip (keys with base_model.model.)
    loaded.save_pretrained(str(tmp_path / "resaved"))
    assert all(k.startswith("base_model.model.") for k in load_file(tmp_path / "resaved/adapter_model.safetensors"))
    with torch.no_grad():
        again = PeftModel.from_pretrained(pruned(), str(tmp_path / "resaved")).eval()(input_ids=IDS).logits
    assert torch.equal(again, got)


def test_bad_input_gets_one_clear_line(tmp_path):
    with pytest.raises(ValueError, match=r"SPPConfig: r=0 must be an integer >= 1"):
        SPPConfig(r=0)
    with pytest.raises(ValueError, match=r"dropout=1.5 must be in \[0, 1\)"):
        SPPConfig(dropout=1.5)
    with pytest.raises(ValueError, match=r"SPPConfig\(r=24\) does not divide out_features=64 of model.layers.0"):
        get_peft_model(pruned(), SPPConfig(r=24))
    model = inject(pruned(), r=8, targets=("q_proj",))
    save_adapter_dir(get_method("spp"), model, tmp_path / "q", {}, PaperSPPConfig(r=8, targets=["q_proj"]))
    config = json.loads((tmp_path / "q/adapter_config.json").read_text())
    (tmp_path / "q/adapter_config.json").write_text(json.dumps({**config, "targets": ["q_proj", "v_proj"]}))
    with pytest.raises(ValueError, match=r"SPP adapter tensors differ from the model \(missing in the file"):
        PeftModel.from_pretrained(pruned(), str(tmp_path / "q"))
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora/adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (tmp_path / "lora/adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"is not an SPP adapter \(peft_type='LORA'\)"):
        from_spp_adapter(pruned(), tmp_path / "lora")
    with pytest.raises(FileNotFoundError, match="No adapter_config.json"):
        from_spp_adapter(pruned(), tmp_path / "nothing")


def test_plain_lora_config_cannot_express_sparsepeft(tmp_path):
    """Point 4, the evidence for the decision: SparsePEFT's folder is peft LoRA (``peft_type: LORA``) plus
    ``sparse_lora.json``; ``PeftModel.from_pretrained`` reads it as plain LoRA, whose merge ``W + s·B A`` fills the
    pruned zeros, while spp's loader (LoRA with a masked custom layer) keeps them."""
    before = zero_patterns(pruned())
    model = inject_sparse_lora(pruned(), r=8)
    train(model, steps=2)
    save_sparse_lora(model, tmp_path)
    assert LoraConfig.from_pretrained(str(tmp_path)).peft_type == PeftType.LORA
    plain = PeftModel.from_pretrained(pruned(), str(tmp_path)).merge_and_unload()
    masked = load_sparse_lora(pruned(), tmp_path).merge_and_unload()
    assert all(torch.equal(z, before[n]) for n, z in zero_patterns(masked).items())
    assert any(not torch.equal(z, before[n]) for n, z in zero_patterns(plain).items())


def python_block(path: Path) -> str:
    """The one fenced ``python`` block of a Markdown file."""
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    assert len(blocks) == 1, f"{path} should hold exactly one python block, found {len(blocks)}"
    return blocks[0]


def test_docs_example_trains_with_the_hf_trainer(tmp_path, monkeypatch):
    """Point 5: the example of docs/peft.md (<= 30 lines) trains with ``transformers.Trainer``, saves, merges."""
    code = python_block(REPO_ROOT / "docs" / "peft.md")
    assert len(code.strip().splitlines()) <= 30
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_peft_example"}
    exec(compile(code, "docs/peft.md", "exec"), namespace)
    state = load_file(tmp_path / "out/spp-peft/adapter/adapter_model.safetensors")
    betas = [v for k, v in state.items() if k.endswith(".spp_beta")]
    assert len(betas) == 14 and all(b.abs().max() > 0 for b in betas), "beta starts at zero: Trainer did not train"
    merged = namespace["merged"]
    assert not any(isinstance(m, SPPLayer) for m in merged.modules())
    for name, zeros in namespace["zeros"].items():
        assert torch.equal(merged.get_parameter(name) == 0, zeros), name
