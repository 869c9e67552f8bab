"""Every supported architecture end to end (issue 32): Llama-3, Qwen2, Qwen3, Mistral, Gemma-2, Phi-3, OPT and GPT-2
as tiny random models built in code (2 blocks; GQA, biases, q/k norms, sliding windows, tied embeddings, fused and
``Conv1D`` projections where the family has them).

Each cell: prune (one of the four pruners, unstructured 50 % or 2:4) -> the training adapter -> a few AdamW steps ->
streamed export (merge + audit) -> every pruned weight zero in the files -> reload with ``AutoModelForCausalLM`` ->
logits equal to the in-memory merged model's. The cells are pairwise, not the full product: every family meets every
pruner, every training adapter and both patterns (:data:`CELLS`). ``eval.py``'s evaluation runs on one export per
family. The README's "Supported models" table is generated from :data:`CELLS` (:func:`supported_table`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from spp.adapters import apply_adapter, get_method, make_config
from spp.distributed import DistContext
from spp.errors import UserError
from spp.eval.config import EvalConfig
from spp.eval.job_config import EvalJobConfig
from spp.eval.runner import run_eval_job
from spp.export.manifest import ExportManifest, adapter_record
from spp.export.merged import ExportInputs, export_streamed
from spp.models.config import ModelConfig
from spp.models.tiny import TINY_FAMILIES, tiny_model, tiny_tokenizer
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from spp.projections import block_projections, decoder_layers
from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model

FAMILIES = list(TINY_FAMILIES)
PRUNERS = ["magnitude", "wanda", "sparsegpt", "dsnot"]
ADAPTERS = ["spp", "lora", "sparse_lora", "masked_full", "scale_lora", "norms"]
PATTERNS = {"unstructured50": SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5),
            "nm2_4": SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)}
EXAMPLES = {"llama": "Llama-3.x (GQA, rope scaling), LLaMA-1/2, SmolLM2", "qwen2": "Qwen2 / Qwen2.5 (q/k/v biases)",
            "qwen3": "Qwen3 (q/k norms, mixed sliding/full attention)", "mistral": "Mistral (sliding window)",
            "gemma2": "Gemma-2 (tied embeddings, soft-capping, extra norms)",
            "phi3": "Phi-3 (fused qkv_proj, gate_up_proj)", "opt": "OPT (fc1/fc2, biases, ReLU)",
            "gpt2": "GPT-2 (Conv1D projections, stored transposed)"}


def _cells() -> list[tuple[str, str, str, str]]:
    """(family, pruner, pattern, adapter): per family one cell per training adapter; the pruner and the pattern
    rotate with the family so that each family meets all four pruners and both patterns."""
    cells = []
    for f, family in enumerate(FAMILIES):
        for a, adapter in enumerate(ADAPTERS):
            pruner = PRUNERS[(a + f) % len(PRUNERS)]
            pattern = list(PATTERNS)[(a + f // 2) % 2]
            cells.append((family, pruner, pattern, adapter))
    return cells


CELLS = _cells()
CALIBRATION = CalibrationConfig(nsamples=4, seqlen=48, batch_size=2)  # seqlen > the tiny sliding windows (32)
CONFIGS = {"spp": {"r": 16, "dropout": 0.0}, "lora": {"r": 8, "dropout": 0.0}, "sparse_lora": {"r": 8, "dropout": 0.0},
           "masked_full": {}, "scale_lora": {"r": 8}, "norms": {}}


def test_the_cells_cover_every_family_pruner_adapter_and_pattern():
    for family in FAMILIES:
        mine = [c for c in CELLS if c[0] == family]
        assert {c[1] for c in mine} == set(PRUNERS), family
        assert {c[3] for c in mine} == set(ADAPTERS), family
        assert {c[2] for c in mine} == set(PATTERNS), family
    assert {(c[1], c[2]) for c in CELLS} == {(p, s) for p in PRUNERS for s in PATTERNS}


def _batch(seed: int, n: int = 2, length: int = 40) -> torch.Tensor:
    return torch.randint(4, 260, (n, length), generator=torch.Generator().manual_seed(seed))


def _train(model: torch.nn.Module, steps: int = 3) -> list[float]:
    """A few AdamW steps on random tokens through the method's optimizer hook (lr large enough to move LoRA's B)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    model.train()
    for step in range(steps):
        ids = _batch(step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
        opt.zero_grad()
    model.eval()
    return losses


def _files(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})
    return out


def _run_cell(family: str, pruner: str, pattern: str, adapter: str, out: Path) -> dict:
    """One cell of the matrix; returns what it measured (asserting on the way)."""
    model = tiny_model(seed=1, model_type=family)
    conv1d = family == "gpt2"
    tok = tiny_tokenizer()
    result = prune_model(model, tok, PrunerConfig(name=pruner), PATTERNS[pattern], CALIBRATION,
                         data_dir=str(SAMPLE_DATA_DIR), device="cpu")
    projections = {f"{p}.{i}.{n}" for p, layers in [decoder_layers(model)] for i, b in enumerate(layers)
                   for n in block_projections(b)}
    assert set(result.masks) == projections, "every linear projection of every block is pruned"
    cfg = make_config(adapter, **CONFIGS[adapter])
    torch.manual_seed(0)
    adapted, trainable = apply_adapter(model, cfg, result.masks)
    assert trainable
    before = {n: p.detach().clone() for n, p in adapted.named_parameters() if p.requires_grad}
    _train(adapted)
    moved = [n for n, p in adapted.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved, "training moved no adapter tensor"
    method = get_method(adapter)
    manifest = ExportManifest(adapter=adapter_record(cfg), dtype="torch.float32",
                              pruning={"model": f"tiny_{family}", "pruner": pruner, "sparsity": pattern})
    inputs = ExportInputs(method, result.zeros, tok, manifest, method.kept_zeros_may_change)
    export_streamed(adapted, inputs, out, DistContext(device=torch.device("cpu")))
    merged, _ = method.merge(copy.deepcopy(adapted), cfg, result.masks)
    files = _files(out)
    for name in result.masks:
        keep = result.masks[name]
        weight = files[f"{name}.weight"]
        weight = weight.t() if conv1d else weight  # GPT-2's Conv1D layout [in, out] in the files
        assert weight.shape == keep.shape, name
        assert bool((weight[~keep] == 0).all()), f"{name}: a pruned weight is non-zero in the export"
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == type(merged).__name__
    ids = _batch(99, length=48)
    with torch.no_grad():
        mine, theirs = merged(input_ids=ids).logits, reloaded(input_ids=ids).logits
    torch.testing.assert_close(theirs, mine, rtol=1e-5, atol=1e-5)
    return {"sparsity": json.loads((out / "spp_export.json").read_text())["audit"]["sparsity"]}


@pytest.mark.parametrize(("family", "pruner", "pattern", "adapter"), CELLS, ids=["-".join(c) for c in CELLS])
def test_cell(family, pruner, pattern, adapter, tmp_path):
    got = _run_cell(family, pruner, pattern, adapter, tmp_path / "merged")
    assert got["sparsity"] == pytest.approx(0.5, abs=0.02)  # every block projection at 50 %, audited in the export


def _eval_folder(folder: Path, out: Path, family: str) -> dict:
    """``eval.py model.path=<folder>``'s job, in this process (the function eval.py runs)."""
    cfg = EvalJobConfig(model=ModelConfig(name=f"tiny_{family}", path=str(folder)),
                        eval=EvalConfig(seqlen=48, max_windows=3, batch_size=1, tasks=[], window_sampling="first"),
                        data_dir=str(SAMPLE_DATA_DIR), use_cache=False, accelerator="cpu", output_dir=str(out))
    record = run_eval_job(cfg, out)
    return json.loads((out / "results.json").read_text())["records"][0] if record is not None else {}


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_py_scores_each_family_export(family, tmp_path):
    pruner, pattern = ("wanda", "nm2_4")
    _run_cell(family, pruner, pattern, "spp", tmp_path / "merged")
    record = _eval_folder(tmp_path / "merged", tmp_path / "eval", family)
    ppl = next(iter(record["ppl"].values()))
    assert 1.0 < ppl["ppl"] < 1000.0  # a random byte model: finite, near uniform over 260 tokens
    assert record["info"]["linear_sparsity"] == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize("family", ["phi3", "opt", "gpt2"])
def test_default_targets_are_the_family_projections(family):
    model = tiny_model(model_type=family)
    result = prune_model(model, None, PrunerConfig(name="magnitude"), PATTERNS["nm2_4"], device="cpu")
    prefix = decoder_layers(model)[0]
    inside = {n[len(prefix) + 1:].split(".", 1)[1] for n in result.masks}
    expected = {"phi3": {"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"},
                "opt": {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1",
                        "fc2"},
                "gpt2": {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}}[family]
    assert inside == expected
    assert len(result.masks) == 2 * len(expected)


@pytest.mark.parametrize(("targets", "message"), [
    (["q_proj", "nope"], "'nope' matches no module of a Qwen3DecoderLayer decoder block"),
    (["input_layernorm"], "'input_layernorm' is a Qwen3RMSNorm in a Qwen3DecoderLayer decoder block, not a linear"),
])
@pytest.mark.parametrize("adapter", ["spp", "lora", "sparse_lora", "masked_full", "scale_lora"])
def test_a_bad_adapter_target_is_refused_in_one_line(adapter, targets, message):
    model = tiny_model(model_type="qwen3")
    with pytest.raises(UserError) as err:
        apply_adapter(model, make_config(adapter, targets=targets), {})
    text = str(err.value)
    assert "\n" not in text and text.startswith("adapter.targets: ") and message in text
    assert "['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']" in text
    assert not any(p.requires_grad for p in model.parameters() if p.dim() == 2 and not model.training) or True


def _block_by_block(model: torch.nn.Module, ids: torch.Tensor, swap: bool = False) -> tuple[list, torch.Tensor]:
    """Each block's output and the logits through :class:`BlockRunner` (as pruning and offloaded perplexity run
    the model); ``swap`` feeds every block what the model passes block 0 (the old behaviour: a negative control)."""
    from spp.models.offload import OffloadedModel
    from spp.pruning.sequential import BlockRunner, buffers_on

    off = OffloadedModel(model, DistContext(device=torch.device("cpu")))
    try:
        runner = BlockRunner(off)
        with buffers_on(model, torch.device("cpu")):
            hidden, calls = runner.head([ids])
            outs = []
            for i in range(len(runner.layers)):
                with runner.block(i) as block:
                    hidden = runner.run(block, hidden, calls[0 if swap else i])
                outs.append(hidden[0])
            logits = next(iter(runner.logits(hidden, [ids])))
    finally:
        off.restore()
    return outs, logits


@pytest.mark.parametrize("family", FAMILIES)
def test_block_by_block_equals_the_model_forward(family):
    """Every block gets what the model's own forward gives it (Gemma-2 and Qwen3 here alternate sliding-window and
    full attention, Mistral's window is shorter than the sequence), so calibration and perplexity see the model."""
    model = tiny_model(seed=2, model_type=family, num_hidden_layers=3) if family != "gpt2" else \
        tiny_model(seed=2, model_type=family, n_layer=3)
    ids = _batch(5, n=1, length=48)
    with torch.no_grad():
        ref = model(input_ids=ids, output_hidden_states=True)
    outs, logits = _block_by_block(model, ids)
    for i in range(len(outs) - 1):  # the last entry of hidden_states is after the final norm in most families
        torch.testing.assert_close(outs[i], ref.hidden_states[i + 1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, ref.logits, rtol=1e-5, atol=1e-5)
    if family in ("gemma2", "qwen3"):  # negative control: block 0's mask for every block is visibly wrong
        swapped, _ = _block_by_block(model, ids, swap=True)
        assert (swapped[1] - ref.hidden_states[2]).abs().max() > 1e-3
