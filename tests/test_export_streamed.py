"""The streamed export: block by block, equal tensor for tensor to ``save_pretrained`` of the whole
merged model, reloadable with ``AutoModelForCausalLM``, at most one block materialised at a time, every merged
weight audited on the way out; on 2 CPU processes with FSDP2 shards and with DDP-style replicas the same files as
one process."""

from __future__ import annotations

import copy
import json
import textwrap
import weakref
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import spp.export.merged as merged_module
from spp.adapters import AdapterConfig, apply_adapter, get_method, make_config
from spp.distributed import DistContext
from spp.export.manifest import ExportManifest, adapter_record
from spp.export.merged import ExportInputs, export_streamed
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model
from spp.pruning.zero_audit import SparsityViolation
from tests.test_pruning_distributed import torchrun

CASES = {
    "spp": make_config("spp", r=4, dropout=0.0),
    "sparse_lora": make_config("sparse_lora", r=4, dropout=0.0),
    "masked_full": make_config("masked_full"),
    "lora": make_config("lora", r=4, dropout=0.0),
    "scale_lora": make_config("scale_lora", r=4),
    "norms": make_config("norms"),
    "none": make_config("none"),
}


def trained(case: str, tie: bool = False, seed: int = 0):
    """A tiny model pruned 2:4 by magnitude, with ``case``'s adapter whose trainable tensors moved (seeded), as
    training leaves them; masked full FT moves only the kept weights. Returns (model, cfg, prune result)."""
    cfg = CASES[case]
    model = tiny_llama(seed=0, tie_word_embeddings=tie)
    result = prune_model(model, None, PrunerConfig(name="magnitude"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                         device="cpu")
    torch.manual_seed(seed)
    model, _ = apply_adapter(model, cfg, result.masks)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.requires_grad:
                step = torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05
                p.add_(step * (p != 0) if case == "masked_full" else step)
    return model, cfg, result


def inputs(cfg: AdapterConfig, result, tokenizer=None) -> ExportInputs:
    method = get_method(cfg.name)
    manifest = ExportManifest(adapter=adapter_record(cfg), dtype="torch.float32",
                              pruning={"model": "tiny", "pruner": "magnitude", "sparsity": "nm2_4"})
    return ExportInputs(method, result.zeros, tokenizer, manifest)


def close(a, b) -> bool:
    """Nested dicts / lists of numbers equal to 1e-9 (relative)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return sorted(a) == sorted(b) and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9)
    return a == b


def tensors_of(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})
    return out


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("case", list(CASES))
def test_streamed_export_equals_save_pretrained_of_the_merged_model(case, tie, tmp_path):
    model, cfg, result = trained(case, tie)
    reference, stats = get_method(cfg.name).merge(copy.deepcopy(model), cfg, result.masks)
    reference.save_pretrained(tmp_path / "reference")
    out = export_streamed(model, inputs(cfg, result, tiny_tokenizer()), tmp_path / "merged", DistContext())
    assert close(out.merge, dict(stats))  # the report of the whole-model merge, from the per-layer merges
    ours, theirs = tensors_of(tmp_path / "merged"), tensors_of(tmp_path / "reference")
    assert sorted(ours) == sorted(theirs)  # the same names, tied weights once
    differ = [k for k in theirs if not torch.equal(ours[k], theirs[k])]
    assert not differ, differ
    assert out.layout["shards"] == reference.config.num_hidden_layers + 1
    manifest = ExportManifest.read(tmp_path / "merged")
    assert manifest.status == "ok" and manifest.audit["layers"] == len(result.masks)
    assert manifest.audit["sparsity"] == pytest.approx(0.5, abs=0.01)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    ids = torch.randint(0, reference.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, reference.eval()(ids).logits)
    assert not list(tmp_path.glob(".merged.*"))  # no temporary left beside it


@pytest.mark.parametrize("family", [{"max_position_embeddings": 64}, {"model_type": "gpt2", "n_positions": 64}],
                         ids=["llama", "gpt2"])
def test_the_export_keeps_the_context_length_under_the_familys_own_name(family, tmp_path):
    """GPT-2's ``config.json`` names its context ``n_positions``: the export writes the model's own config, so the
    exported folder's context (as the preflight reads it) is the model's 64, not a family default (GPT-2's 1024)."""
    from spp.models.tiny import tiny_model
    from spp.preflight.shapes import check_shapes

    model = tiny_model(**family)
    result = prune_model(model, None, PrunerConfig(name="magnitude"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                         device="cpu")
    cfg = make_config("none")
    model, _ = apply_adapter(model, cfg, result.masks)
    export_streamed(model, inputs(cfg, result), tmp_path / "merged", DistContext())
    written = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert {k: written[k] for k in family} == family
    check_shapes(written, seqlens={"eval.seqlen": 64})  # negative control: the context itself passes
    with pytest.raises(ValueError, match="eval.seqlen=65 exceeds the model's max_position_embeddings=64"):
        check_shapes(written, seqlens={"eval.seqlen": 65})


def test_at_most_one_block_is_materialised_while_exporting(tmp_path, monkeypatch):
    model, cfg, result = trained("spp")
    alive: list[weakref.ref] = []
    most = []
    real = merged_module.merged_block_tensors

    def spy(*args, **kwargs):
        most.append(sum(r() is not None for r in alive))  # earlier blocks' merged tensors still alive
        out = real(*args, **kwargs)
        alive.extend(weakref.ref(t) for t in out[0].values())
        return out

    monkeypatch.setattr(merged_module, "merged_block_tensors", spy)
    export_streamed(model, inputs(cfg, result), tmp_path / "merged", DistContext())
    assert len(most) == model.config.num_hidden_layers and max(most) == 0
    assert all(r() is None for r in alive)


def test_a_revived_pruned_weight_fails_the_export_and_keeps_nothing(tmp_path):
    model, cfg, result = trained("masked_full")
    name = next(iter(result.masks))
    mask = result.masks[name]
    row, col = map(int, torch.nonzero(~mask)[0])
    with torch.no_grad():
        model.get_submodule(name).weight[row, col] = 1.0  # the regression: a pruned weight came back
    with pytest.raises(SparsityViolation, match=name.replace(".", r"\.")):
        export_streamed(model, inputs(cfg, result), tmp_path / "merged", DistContext())
    assert not (tmp_path / "merged").exists() and not list(tmp_path.glob(".merged.*"))


RANKS = """
import json, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
import spp.export.merged as merged_module
from spp.distributed import DistContext
from spp.export.merged import export_streamed
from spp.training.strategies import shard_model
from tests.test_export_streamed import inputs, trained

torch.set_num_threads(1)
dist.init_process_group("gloo")
ctx = DistContext.current("cpu")
case, sharded, out = sys.argv[1], sys.argv[2] == "fsdp", sys.argv[3]
model, cfg, result = trained(case)
if not ctx.is_main:
    result.zeros = None  # only rank 0 holds the pruning result
whole_blocks = []
if sharded:
    shard_model(model, init_device_mesh("cpu", (2,)), LlamaDecoderLayer)
    real = merged_module.merged_block_tensors
    layers = merged_module.decoder_layers(model)[1]
    def spy(*args, **kwargs):
        whole_blocks.append(sum(not any(isinstance(p, DTensor) for p in b.parameters()) for b in layers))
        return real(*args, **kwargs)
    merged_module.merged_block_tensors = spy
res = export_streamed(model, inputs(cfg, result), out, ctx)
with open(f"{out}.rank{ctx.rank}.json", "w") as fh:
    json.dump({"whole_blocks": whole_blocks, "shards": res.layout["shards"], "writers": res.layout["writers"]}, fh)
dist.destroy_process_group()
"""


@pytest.mark.slow  # two processes (18 s); the one-process streamed export is tested above; CI runs it
@pytest.mark.parametrize("placement", ["fsdp", "replicas"])
def test_two_processes_write_the_one_process_export(placement, tmp_path):
    case = "spp" if placement == "fsdp" else "lora"
    model, cfg, result = trained(case)
    export_streamed(model, inputs(cfg, result), tmp_path / "one", DistContext())
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(RANKS))
    proc = torchrun(script, 2, case, placement, str(tmp_path / "two"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    one, two = tensors_of(tmp_path / "one"), tensors_of(tmp_path / "two")
    assert sorted(one) == sorted(two) and all(torch.equal(one[k], two[k]) for k in one)
    rows = [json.loads((tmp_path / f"two.rank{r}.json").read_text()) for r in range(2)]
    assert all(r["writers"] == 2 for r in rows)
    if placement == "fsdp":  # each rank merged its share of blocks, one whole block at a time
        blocks = model.config.num_hidden_layers
        assert [len(r["whole_blocks"]) for r in rows] == [len(range(r, blocks, 2)) for r in range(2)]
        assert all(n == 1 for r in rows for n in r["whole_blocks"])
    manifest = json.loads((tmp_path / "two" / "spp_export.json").read_text())
    assert manifest["layout"]["writers"] == 2 and manifest["audit"]["layers"] == len(result.masks)


def test_deepspeed_fp32_masters_override_the_rounded_module_copies(tmp_path):
    """Under DeepSpeed ``bf16-mixed`` the module's copies of the trained tensors are bf16; the fp32 masters, given as
    overrides, are what is merged: the export equals the fp32 model's (and without them it would not)."""
    model, cfg, result = trained("spp")
    masters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    export_streamed(model, inputs(cfg, result), tmp_path / "fp32", DistContext())
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(p.to(torch.bfloat16).float())  # what the module holds after bf16-mixed
    overridden = inputs(cfg, result)
    overridden.overrides = masters
    export_streamed(model, overridden, tmp_path / "masters", DistContext())
    export_streamed(model, inputs(cfg, result), tmp_path / "rounded", DistContext())
    fp32, masters_out, rounded = (tensors_of(tmp_path / d) for d in ("fp32", "masters", "rounded"))
    assert all(torch.equal(fp32[k], masters_out[k]) for k in fp32)
    assert any(not torch.equal(fp32[k], rounded[k]) for k in fp32)  # the negative control: rounding shows
