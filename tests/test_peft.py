"""SPP and SparsePEFT as registered peft methods (``spp.peft``): train as ``spp.inject`` / ``inject_sparse_lora``,
read train.py's adapter folders, merge keeping every zero, on every block projection of Phi-3, OPT, GPT-2, Gemma-2;
the example of ``docs/peft.md`` runs."""

from __future__ import annotations

import copy
import importlib
import json
import re
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, LoraModel, PeftModel, PeftType, get_peft_model
from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_PREFIX_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModelForCausalLM

import spp.peft
from spp.adapters.methods.sparse_lora.layer import (
    SparseLoraLinear,
    inject_sparse_lora,
    load_sparse_lora,
    save_sparse_lora,
    sparse_lora_layers,
)
from spp.adapters.methods.spp.config import SPPAdapterConfig as PaperSPPConfig
from spp.adapters.methods.spp.model import inject, merge_and_unload, spp_layers
from spp.adapters.registry import get_method, load_adapter_dir, save_adapter_dir
from spp.errors import UserError
from spp.models.conv1d import Conv1DAsLinear
from spp.models.tiny import tiny_llama, tiny_model
from spp.paths import REPO_ROOT
from spp.peft import (
    SparseLoraConfig,
    SparseLoraModel,
    SPPConfig,
    SPPLayer,
    SPPModel,
    from_sparse_lora_adapter,
    from_spp_adapter,
)
from spp.peft.registration import register_with_peft
from spp.projections import DEFAULT_TARGETS, current_masks, find_projections, matches
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model

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


def test_each_method_says_its_peft_form_and_the_package_registers_what_they_say():
    """``spp.peft`` names no method: it registers each method's own ``peft_integration`` (the tuner in the method's
    folder) and exports what it exports; a method without one (``norms``) is not registered."""
    forms = {name: get_method(name).peft_integration() for name in ("spp", "sparse_lora", "lora", "norms")}
    assert forms["norms"] is None
    assert [f.name for f in (forms["spp"], forms["sparse_lora"], forms["lora"])] == ["spp", "sparse_lora", "lora_star"]
    for form in (forms["spp"], forms["sparse_lora"], forms["lora"]):
        assert form.model_class.__module__.startswith("spp.adapters.methods.")
        assert PEFT_TYPE_TO_TUNER_MAPPING[form.name.upper()] is form.model_class
        assert all(getattr(spp.peft, obj.__name__) is obj for obj in form.exports)
    assert spp.peft.SPPModel is forms["spp"].model_class and set(spp.peft.__all__) >= {"SPPConfig", "LoraStarConfig"}


def test_registration_is_idempotent():
    register_with_peft(SPPConfig, SPPModel, "spp", "spp_")
    importlib.reload(spp.peft)  # the package's import registers again: a no-op
    assert PEFT_TYPE_TO_TUNER_MAPPING[PeftType.SPP] is SPPModel
    assert PEFT_TYPE_TO_TUNER_MAPPING[PeftType.SPARSE_LORA] is SparseLoraModel
    # the same classes re-created by a re-imported module replace the old ones; a foreign 'spp' method is refused
    again = type("SPPModel", (SPPModel,), {"__module__": SPPModel.__module__})
    try:
        register_with_peft(SPPConfig, again, "spp", "spp_")
        assert PEFT_TYPE_TO_TUNER_MAPPING[PeftType.SPP] is again
        with pytest.raises(RuntimeError, match="already has a method named 'spp'"):
            register_with_peft(SPPConfig, type("Other", (SPPModel,), {"__module__": "elsewhere"}), "spp", "spp_")
    finally:
        register_with_peft(SPPConfig, SPPModel, "spp", "spp_")
    assert PEFT_TYPE_TO_TUNER_MAPPING[PeftType.SPP] is SPPModel and PEFT_TYPE_TO_CONFIG_MAPPING["SPP"] is SPPConfig


def _trained_alike(pair, peft_read, ref_read, trainable_name: str) -> None:
    """The peft model of ``pair`` and spp's own from one seed: the same initial tensors, losses, and (1e-6) trained
    tensors, every one moved; only the 28 adapter tensors named like ``trainable_name`` train."""
    peft_model, ref, (init_peft, init_ref), losses_peft, losses_ref = pair
    assert list(init_peft) == list(init_ref) and len(init_peft) == 2 * 7 * 2
    for key, value in init_peft.items():
        assert torch.equal(value, init_ref[key]), key
    assert losses_peft == pytest.approx(losses_ref, abs=1e-6) and losses_peft[-1] < losses_peft[0]
    trained, reference = peft_read(peft_model), ref_read(ref)
    for key, value in trained.items():
        assert not torch.equal(value, init_peft[key]), f"{key} did not train"
        torch.testing.assert_close(value, reference[key], rtol=0, atol=1e-6, msg=key)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert len(trainable) == 28 and all(re.search(trainable_name, n) for n in trainable)


def test_get_peft_model_trains_exactly_as_inject(trained_pair):
    """Point 1: same init and, after AdamW steps with dropout on, the same alpha and beta as ``spp.inject``."""
    _trained_alike(trained_pair, peft_tensors, spp_tensors, r"\.spp_(alpha|beta)\.default$")


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

    own, _ = load_adapter_dir(pruned(), run, current_masks(pruned()))
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


def magnitude_pruned(family: str) -> nn.Module:
    """A tiny model of ``family`` pruned to 50 % by magnitude (spp's pruning engine; GPT-2 comes back linearized)."""
    model = tiny_model(0, model_type=family)
    prune_model(model, None, PrunerConfig(name="magnitude"),
                SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5), device="cpu")
    return model


@pytest.mark.parametrize("family", ["phi3", "opt", "gpt2", "gemma2"])
def test_every_family_adapts_its_block_projections_and_merges_keeping_zeros(family, tmp_path):
    """Architectures: ``SPPConfig()``'s default targets are the model's own block projections; after AdamW steps the
    merge keeps the zero pattern bit for bit, and a saved merged model reloads (plain transformers) to the same
    logits."""
    model = magnitude_pruned(family)
    expected = list(find_projections(model, DEFAULT_TARGETS))
    keys = [f"{name}.weight" for name in expected]
    before = {k: v.clone() for k, v in model.state_dict().items() if k in keys}  # GPT-2: Conv1D layout
    assert len(before) == len(keys) and all((w == 0).float().mean() == 0.5 for w in before.values())
    peft_model = get_peft_model(model, SPPConfig())
    adapted = [n for n, m in peft_model.base_model.model.named_modules() if isinstance(m, SPPLayer)]
    assert adapted == expected
    train(peft_model)
    merged = peft_model.merge_and_unload().eval()
    after = merged.state_dict()
    for key, weight in before.items():
        assert torch.equal(after[key] == 0, weight == 0), key
        assert not torch.equal(after[key], weight), f"{key}: the merge changed nothing"
    merged.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=IDS).logits, merged(input_ids=IDS).logits)


@pytest.mark.parametrize("config", [SPPConfig(), SparseLoraConfig()], ids=["spp", "sparse_lora"])
def test_gpt2_conv1d_layers_are_adapted_as_linear(config, tmp_path):
    """A GPT-2 straight from transformers (``Conv1D`` projections) adapts through peft: each ``Conv1D`` is held as
    an ``nn.Linear`` whose state dict keeps the Conv1D layout, so the merged model saves as a plain GPT-2."""
    model = tiny_model(0, model_type="gpt2")
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    conv = [n for n, m in model.named_modules() if type(m).__name__ == "Conv1D"]
    assert len(conv) == 8
    peft_model = get_peft_model(model, copy.deepcopy(config))
    layers = {n: m for n, m in peft_model.base_model.model.named_modules() if isinstance(m, (SPPLayer,
                                                                                                SparseLoraLinear))}
    assert sorted(layers) == sorted(conv)
    assert all(isinstance(m.get_base_layer(), Conv1DAsLinear) for m in layers.values())
    merged = peft_model.merge_and_unload()
    assert {k: v.shape for k, v in merged.state_dict().items()} == shapes
    merged.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded.transformer.h[0].attn.c_attn).__name__ == "Conv1D"
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=IDS).logits, merged.eval()(input_ids=IDS).logits)


def sparse_tensors(model: PeftModel) -> dict[str, torch.Tensor]:
    """``{<module path>.lora_A / .lora_B: weight}`` of a SparsePEFT peft model."""
    return {f"{name}.{key}": getattr(layer, key)["default"].weight.detach()
            for name, layer in sparse_lora_layers(model) for key in ("lora_A", "lora_B")}


@pytest.fixture(scope="module")
def sparse_pair():
    """The same pruned model adapted by ``get_peft_model(SparseLoraConfig(r=8))`` and by ``inject_sparse_lora(r=8)``
    from the same seed, both trained ``STEPS`` AdamW steps; with their initial tensors and losses."""
    torch.manual_seed(0)
    peft_model = get_peft_model(pruned(), SparseLoraConfig(r=8, lora_alpha=16, lora_dropout=0.05))
    torch.manual_seed(0)
    ref = inject_sparse_lora(pruned(), r=8, alpha=16.0, dropout=0.05)
    init = (copy.deepcopy(sparse_tensors(peft_model)), copy.deepcopy(sparse_tensors(ref)))
    return peft_model, ref, init, train(peft_model), train(ref)


def test_sparse_lora_is_a_registered_peft_method():
    cfg = SparseLoraConfig()
    assert isinstance(cfg, LoraConfig) and cfg.peft_type is PeftType.SPARSE_LORA and PeftType("SPARSE_LORA")
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout) == (8, 16.0, 0.05)  # adapter=sparse_lora's
    assert set(cfg.target_modules) == set(DEFAULT_TARGETS)
    assert PEFT_TYPE_TO_CONFIG_MAPPING["SPARSE_LORA"] is SparseLoraConfig
    assert PEFT_TYPE_TO_TUNER_MAPPING["SPARSE_LORA"] is SparseLoraModel and issubclass(SparseLoraModel, LoraModel)
    assert PEFT_TYPE_TO_PREFIX_MAPPING[PeftType.SPARSE_LORA] == "lora_"
    with pytest.raises(ValueError, match=r"^SparseLoraConfig: use_dora=True is not supported"):
        SparseLoraConfig(use_dora=True)
    with pytest.raises(ValueError, match=r"SparsePEFT adapts nn.Linear layers only, but target model.embed_tokens"):
        get_peft_model(pruned(), SparseLoraConfig(target_modules=["embed_tokens"]))


def test_get_peft_model_sparse_lora_trains_exactly_as_inject_sparse_lora(sparse_pair):
    """Same initial A/B and, after AdamW steps with dropout on, the same A/B (1e-6) as spp's ``inject_sparse_lora``;
    only A and B train."""
    _trained_alike(sparse_pair, sparse_tensors, sparse_tensors, r"\.lora_[AB]\.default\.weight$")


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def old_folder(new: Path, old: Path) -> Path:
    """A copy of a SparsePEFT folder as spp wrote it before recording its own type (``"peft_type": "LORA"``)."""
    old.mkdir()
    for f in new.iterdir():
        (old / f.name).write_bytes(f.read_bytes())
    config = json.loads((new / "adapter_config.json").read_text())
    (old / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "LORA"}))
    return old


def test_sparse_lora_folder_loads_through_peft_keeping_zeros(sparse_pair, tmp_path):
    """spp's SparsePEFT folder says ``peft_type: SPARSE_LORA``: ``PeftModel.from_pretrained`` loads the masked layer
    (logits of spp's ``load_sparse_lora``) and its merge ``W + s·(B A) ⊙ M`` keeps every zero. Negative control: the
    same tensors read as plain LoRA (a folder written before, ``peft_type: LORA``) fill the zeros; that folder loads
    masked with ``from_sparse_lora_adapter`` and spp's loader."""
    _, ref, *_ = sparse_pair
    before = zero_patterns(pruned())
    new = save_sparse_lora(ref, tmp_path / "new")
    assert json.loads((new / "adapter_config.json").read_text())["peft_type"] == "SPARSE_LORA"
    expected = logits(load_sparse_lora(pruned(), new))
    loaded = PeftModel.from_pretrained(pruned(), str(new))
    assert isinstance(loaded.base_model, SparseLoraModel) and isinstance(loaded.peft_config["default"],
                                                                          SparseLoraConfig)
    torch.testing.assert_close(logits(loaded), expected, rtol=0, atol=1e-6)
    masked = loaded.merge_and_unload()
    assert zero_patterns(masked).keys() == before.keys()
    assert all(torch.equal(z, before[n]) for n, z in zero_patterns(masked).items())

    old = old_folder(new, tmp_path / "old")
    plain = PeftModel.from_pretrained(pruned(), str(old))
    assert type(plain.base_model) is LoraModel
    assert any(not torch.equal(z, before[n]) for n, z in zero_patterns(plain.merge_and_unload()).items())
    for model in (from_sparse_lora_adapter(pruned(), old), load_sparse_lora(pruned(), old)):
        torch.testing.assert_close(logits(model), expected, rtol=0, atol=1e-6)
        assert all(torch.equal(z, before[n]) for n, z in zero_patterns(model.merge_and_unload()).items())


def test_sparse_lora_peft_save_round_trip_and_clear_errors(sparse_pair, tmp_path):
    """peft's own ``save_pretrained`` of a SparsePEFT model (no ``sparse_lora.json``) reads back through peft and
    through spp's loader; folders that are not SparsePEFT, or a base pruned otherwise, get one clear line."""
    peft_model, *_ = sparse_pair
    peft_model.save_pretrained(str(tmp_path / "peft"))
    assert not (tmp_path / "peft/sparse_lora.json").exists()
    expected = logits(copy.deepcopy(peft_model))
    for loaded in (PeftModel.from_pretrained(pruned(), str(tmp_path / "peft")),
                   load_sparse_lora(pruned(), tmp_path / "peft")):
        torch.testing.assert_close(logits(loaded), expected, rtol=0, atol=1e-6)

    lora = get_peft_model(pruned(), LoraConfig(r=4, target_modules=["q_proj"]))
    lora.save_pretrained(str(tmp_path / "lora"))
    with pytest.raises(ValueError, match=r"is a plain LoRA adapter \(peft_type='LORA', no sparse_lora.json\)"):
        from_sparse_lora_adapter(pruned(), tmp_path / "lora")
    model = inject(pruned(), r=8, targets=("q_proj",))
    save_adapter_dir(get_method("spp"), model, tmp_path / "spp", {}, PaperSPPConfig(r=8, targets=["q_proj"]))
    with pytest.raises(ValueError, match=r"is not a SparsePEFT adapter \(peft_type='SPP'\)"):
        from_sparse_lora_adapter(pruned(), tmp_path / "spp")
    with pytest.raises(FileNotFoundError, match="No adapter_config.json"):
        from_sparse_lora_adapter(pruned(), tmp_path / "nothing")
    save_sparse_lora(peft_model, tmp_path / "marked")
    other = pruned()
    q = other.model.layers[0].self_attn.q_proj.weight.view(-1)
    with torch.no_grad():  # one more zero: a base pruned otherwise
        q[q.nonzero()[0]] = 0.0
    with pytest.raises(ValueError, match=r"mask sizes differ from .* at \['model.layers.0.self_attn.q_proj'\]"):
        from_sparse_lora_adapter(other, old_folder(tmp_path / "marked", tmp_path / "old"))


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


def test_eval_adapter_dir_reads_peft_save_pretrained_folders_of_masked_lora_methods(sparse_pair, tmp_path):
    """``eval.py adapter_dir=`` (``load_adapter_dir``) reads peft's own ``save_pretrained`` of a SparsePEFT and of a
    LoRA* model (no ``adapter_method.json``) as docs/peft.md says, merged as peft's ``merge_and_unload`` merges them;
    a plain peft LoRA folder is still refused (its merge would fill the zeros)."""
    peft_model, *_ = sparse_pair
    star = get_peft_model(pruned(), spp.peft.LoraStarConfig(r=4))
    with torch.no_grad():
        for name, p in star.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(2))
    for label, model in (("sparse", peft_model), ("star", star)):
        model.save_pretrained(str(tmp_path / label))
        loaded, info = load_adapter_dir(pruned(), tmp_path / label, {})
        expected = copy.deepcopy(model).merge_and_unload()
        assert info["method"] == {"sparse": "sparse_lora", "star": "lora"}[label]
        assert all(torch.equal(p, expected.state_dict()[n]) for n, p in loaded.state_dict().items()), label
    plain = get_peft_model(pruned(), LoraConfig(r=4, target_modules=["q_proj"]))
    plain.save_pretrained(str(tmp_path / "plain"))
    with pytest.raises(UserError, match=r"is not an adapter directory \(no adapter_method.json\)"):
        load_adapter_dir(pruned(), tmp_path / "plain", {})


@pytest.mark.parametrize("dtype", ["bfloat16", "float64"])
@pytest.mark.parametrize("name", ["spp", "sparse_lora", "lora"])
def test_peft_loaders_of_a_folder_in_another_dtype_merge_to_the_runs_export(name, dtype, tmp_path):
    """``PeftModel.from_pretrained`` and the method's ``from_*_adapter`` of an ``adapter.dtype=bfloat16|float64``
    folder keep the factors in the file's dtype (peft copied them into fp32, then upcast bf16), so
    ``merge_and_unload()`` equals the run's export bit for bit; a factor left fp32 is the control that differs."""
    from spp.adapters.registry import apply_adapter, option_config

    helper = {"spp": from_spp_adapter, "sparse_lora": from_sparse_lora_adapter,
              "lora": spp.peft.from_lora_star_adapter}[name]
    cfg = option_config(name, dtype=dtype, r=4)
    model = pruned()
    masks = current_masks(model)
    model, _ = apply_adapter(model, cfg, masks)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in (p for p in model.parameters() if p.requires_grad):
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    save_adapter_dir(get_method(name), model, tmp_path, {}, cfg)
    expected = get_method(name).merge(model, cfg, masks)[0].state_dict()
    for load in (lambda m: PeftModel.from_pretrained(m, str(tmp_path)), lambda m: helper(m, tmp_path)):
        loaded = load(pruned())
        assert {str(p.dtype) for n, p in loaded.named_parameters() if "lora_" in n or "alpha" in n or "beta" in n} \
            == {f"torch.{dtype}"}
        merged = copy.deepcopy(loaded).merge_and_unload().state_dict()
        assert [k for k, t in merged.items() if not torch.equal(t, expected[k])] == []
    if name != "spp":  # SPP's merge computes in the weight's dtype: its factors' dtype never showed
        for p in (p for n, p in loaded.named_parameters() if "lora_" in n):
            p.data = p.data.float()  # control: factors in fp32, as peft loaded them
        merged = loaded.merge_and_unload().state_dict()
        assert any(not torch.equal(t, expected[k]) for k, t in merged.items())
