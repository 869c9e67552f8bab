"""Every supported architecture end to end: Llama-3, Qwen2, Qwen3, Mistral, Gemma-2, Phi-3, OPT and GPT-2
as tiny random models built in code (2 blocks; GQA, biases, q/k norms, sliding windows, tied embeddings, fused and
``Conv1D`` projections where the family has them).

The cells (:data:`lab.bench.architectures.CELLS`): prune (one of the four pruners, unstructured 50 % or 2:4) -> the
training adapter -> a few AdamW steps -> streamed export (merge + audit) -> every pruned weight zero in the files ->
reload with ``AutoModelForCausalLM`` -> logits equal to the in-memory merged model's; pairwise, not the full
product. ``eval.py``'s evaluation runs on one export per family, ``train.py`` on ``model=tiny_qwen3``. The README's
"Supported models" table is the committed run of the same cells (``benchmarks/architectures.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lab.bench.architectures import ADAPTERS, CELLS, FAMILIES, GROUPS, PATTERNS, PRUNERS, run_cell, supported_table
from spp.adapters import apply_adapter, get_method, make_config, method_names
from spp.distributed import DistContext
from spp.errors import UserError
from spp.eval.config import EvalConfig
from spp.eval.job_config import EvalJobConfig
from spp.eval.runner import run_eval_job
from spp.models.config import ModelConfig
from spp.models.tiny import tiny_model
from spp.paths import CONF_DIR, REPO_ROOT, SAMPLE_DATA_DIR
from spp.projections import block_projections, decoder_layers
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model

PATTERN_CONFIGS = {"unstructured50": SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5),
                   "nm2_4": SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)}

def test_the_cells_cover_every_family_pruner_adapter_and_pattern():
    for family in FAMILIES:
        mine = [c for c in CELLS if c[0] == family]
        assert {c[1] for c in mine} == set(PRUNERS), family
        assert {c[3] for c in mine} == set(ADAPTERS), family
        assert {c[2] for c in mine} == set(PATTERNS), family
    assert {(c[1], c[2]) for c in CELLS} == {(p, s) for p in PRUNERS for s in PATTERNS}
    assert set(ADAPTERS) == {n for n in method_names() if get_method(n).trains}  # every training adapter


def _batch(seed: int, n: int = 2, length: int = 40) -> torch.Tensor:
    return torch.randint(4, 260, (n, length), generator=torch.Generator().manual_seed(seed))


def _run_cell(family: str, pruner: str, pattern: str, adapter: str, out: Path) -> dict:
    return run_cell(family, pruner, pattern, adapter, out, str(SAMPLE_DATA_DIR))


@pytest.mark.parametrize(("family", "pruner", "pattern", "adapter"), CELLS, ids=["-".join(c) for c in CELLS])
def test_cell(family, pruner, pattern, adapter, tmp_path):
    got = _run_cell(family, pruner, pattern, adapter, tmp_path / "merged")
    assert got["export_sparsity"] == pytest.approx(0.5, abs=0.02)  # every block projection at 50 %, audited
    assert got["pruned_layers"] == 2 * len(block_projections(decoder_layers(tiny_model(model_type=family))[1][0]))


def _eval_folder(folder: Path, out: Path, family: str) -> dict:
    """``eval.py model.path=<folder>``'s job, in this process (the function eval.py runs)."""
    cfg = EvalJobConfig(model=ModelConfig(name=f"tiny_{family}", path=str(folder)),
                        eval=EvalConfig(seqlen=48, max_windows=3, batch_size=1, tasks=[], window_sampling="first"),
                        data_dir=str(SAMPLE_DATA_DIR), use_cache=False, accelerator="cpu", run_dir=str(out))
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
    result = prune_model(model, None, PrunerConfig(name="magnitude"), PATTERN_CONFIGS["nm2_4"], device="cpu")
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
    names = [n for n, _ in model.named_parameters()]
    with pytest.raises(UserError) as err:
        apply_adapter(model, make_config(adapter, targets=targets), {})
    text = str(err.value)
    assert "\n" not in text and text.startswith("adapter.targets: ") and message in text
    assert "['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']" in text
    assert [n for n, _ in model.named_parameters()] == names  # refused before any layer was wrapped


def _block_by_block(model: torch.nn.Module, ids: torch.Tensor, swap: bool = False) -> tuple[list, torch.Tensor]:
    """Each block's output and the logits through :class:`BlockRunner` (as pruning and offloaded perplexity run
    the model); ``swap`` feeds every block what the model passes block 0 (the old behaviour: a negative control)."""
    from spp.models.block_runner import BlockRunner, buffers_on
    from spp.models.offload import OffloadedModel

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


@pytest.mark.parametrize(("targets", "message"), [
    (["c_attn", "nope"], "'nope' matches no module of a GPT2Block decoder block"),
    (["ln_1"], "'ln_1' is a LayerNorm in a GPT2Block decoder block, not a linear projection"),
])
def test_a_bad_pruner_target_is_refused_before_any_work(targets, message):
    model = tiny_model(model_type="gpt2")
    with pytest.raises(UserError) as err:
        prune_model(model, None, PrunerConfig(name="magnitude", targets=targets), PATTERN_CONFIGS["nm2_4"],
                    device="cpu")
    assert "\n" not in str(err.value) and str(err.value).startswith("pruner.targets: ") and message in str(err.value)
    assert "['c_attn', 'c_proj', 'c_fc']" in str(err.value)
    assert not any(bool((p == 0).any()) for p in model.parameters() if p.dim() == 2)  # nothing pruned


def test_readme_supported_models_table_is_the_committed_matrix_run():
    """The README's table is ``benchmarks/architectures.py``'s rendering of its committed raw records, which cover
    exactly the cells this file runs, every one passed."""
    raw = json.loads((REPO_ROOT / "docs" / "results" / "architectures.json").read_text())
    cells = [(r["family"], r["pruner"], r["pattern"], r["adapter"]) for r in raw["cells"]]
    assert cells == CELLS and all(r["ok"] for r in raw["cells"])
    readme = (REPO_ROOT / "README.md").read_text()
    begin, end = "<!-- supported-models:begin -->\n", "<!-- supported-models:end -->\n"
    assert readme.split(begin, 1)[1].split(end, 1)[0] == supported_table(raw["cells"])
    broken = [{**raw["cells"][0], "ok": False, "error": "ValueError: boom"}, *raw["cells"][1:]]
    assert "✘ spp: ValueError: boom" in supported_table(broken)  # negative control: a failed cell shows


def test_every_family_has_its_model_groups():
    for family, groups in GROUPS.items():
        for group in groups:
            assert (CONF_DIR / "model" / f"{group}.yaml").is_file(), (family, group)


def test_train_py_runs_the_whole_pipeline_on_tiny_qwen3(tmp_path):
    """``python train.py model=tiny_qwen3 ...``'s job in this process: prune (Wanda 2:4, calibration through the
    mixed sliding/full attention blocks), train SPP, merge, export, evaluate."""
    from train_helpers import tiny_job

    from train import run_job

    job = tiny_job(tmp_path, "model=tiny_qwen3")
    run_job(job)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["sparsity"]["before"] == pytest.approx(0.5) and summary["sparsity"]["after"] == pytest.approx(0.5)
    assert summary["sparsity"]["audits"][-1]["layers"] == 14  # 7 projections x 2 blocks, zeros audited after merge
    merged = tmp_path / "run" / "merged"
    config = json.loads((merged / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["dtype"] == "float32"
    assert 1.0 < summary["perplexity"]["merged"]["ppl"] < 1000.0
    _peft_loads_the_run_adapter(job, tmp_path / "run")


def _peft_loads_the_run_adapter(job, run: Path) -> None:
    """``PeftModel.from_pretrained(pruned base, <run>/adapter)`` merges to the run's exported model (what ``eval.py``
    scores), zeros kept bit for bit."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    import spp.peft  # noqa: F401 - registers SPP with peft
    from spp.models.loading import load_model
    from spp.pruning.reconstruction.config import ReconstructConfig
    from spp.pruning.reconstruction.phase import get_or_reconstruct

    base, tok = load_model(job.model)
    result, _ = get_or_reconstruct(base, tok, job.model, job.pruner, job.sparsity, job.calibration, ReconstructConfig(),
                                   job.cache_dir, job.data_dir, "cpu")
    assert result.cache_hit  # the run's own pruning
    zeros = {n: p == 0 for n, p in base.named_parameters() if p.dim() == 2}
    merged = PeftModel.from_pretrained(base, str(run / "adapter")).merge_and_unload()
    exported = AutoModelForCausalLM.from_pretrained(run / "merged", dtype=torch.float32).eval()
    ids = torch.randint(4, 260, (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, exported(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    for name, param in merged.named_parameters():
        if name in zeros and "layers" in name:
            assert torch.equal(param == 0, zeros[name]), name


def test_fsdp2_block_class_comes_from_the_model():
    """``model.decoder_layer_cls=auto`` shards each family's own blocks (what ``_no_split_modules`` names); a class
    of another family is refused in one line instead of sharding the whole model as one unit."""
    from spp.training.strategies import checked_layer_class, decoder_layer_class

    for family in FAMILIES:
        model = tiny_model(model_type=family)
        own = checked_layer_class(model, decoder_layer_class("auto"))
        assert own.__name__ in model._no_split_modules, (family, own)
        assert checked_layer_class(model, decoder_layer_class(own.__name__)) is own
    with pytest.raises(UserError) as err:
        checked_layer_class(tiny_model(model_type="qwen2"), decoder_layer_class("LlamaDecoderLayer"))
    assert str(err.value).startswith("model.decoder_layer_cls=LlamaDecoderLayer matches no module of Qwen2ForCausalLM")
    assert "set model.decoder_layer_cls=auto" in str(err.value) and "\n" not in str(err.value)
