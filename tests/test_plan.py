"""The run plan's terms (``spp.planning``) against formulas written out independently: trainable parameters per
adapter method, sharded and replicated weights, AdamW and DeepSpeed states, activations with and without
checkpointing, the FLOP model of a frozen base, the evaluation placement, and the refusal's fix."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spp.adapters.registry import make_config
from spp.errors import UserError
from spp.planning.adapter import adapter_spec
from spp.planning.check import fix, problems
from spp.planning.flops import matmul_params, train_flops
from spp.planning.hardware import CPU_HOST, GPU_NODE
from spp.planning.memory import block_activation_bytes, fit_device_bytes, optimizer_terms, training_activations
from spp.planning.placement import WEIGHT_SHARE, eval_placement
from spp.planning.run import plan_run
from spp.planning.shapes import shape_from_arch
from spp.planning.spec import AdapterSpec, EvalSpec, RunSpec, TrainSpec
from spp.projections import DEFAULT_TARGETS

GIB = 2**30
LLAMA2_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "vocab_size": 32000}
LLAMA_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 32, "vocab_size": 32000}
TARGETS = tuple(DEFAULT_TARGETS)


@pytest.fixture(scope="module")
def shape70():
    return shape_from_arch("llama2_70b", LLAMA2_70B, list(DEFAULT_TARGETS))


@pytest.fixture(scope="module")
def shape7():
    return shape_from_arch("llama7b", LLAMA_7B, list(DEFAULT_TARGETS))


def _adapter(shape, name: str, **values) -> AdapterSpec:
    """What method ``name`` answers for ``shape``'s model (its ``inject`` on the ``meta`` skeleton, in bf16)."""
    arch = LLAMA2_70B if shape.blocks == 80 else LLAMA_7B
    return adapter_spec(make_config(name, **values), arch, shape, "bfloat16")


def _spec(shape, **kw) -> RunSpec:
    adapter = kw.pop("adapter", None) or _adapter(shape, "spp", r=16, dropout=0.0)
    train = kw.pop("train", TrainSpec(micro_batch=8, seqlen=512, tokens_per_example=192, checkpointing=True,
                                      examples=1000, global_batch=128))
    return RunSpec(shape=shape, adapter=adapter, train=train, prunes=True, pruner="wanda", **kw)


def test_shape_counts_every_block_from_two_built_ones(shape70):
    assert shape70.params == 68_976_648_192 and shape70.blocks == 80
    tied = shape_from_arch("t", {**LLAMA_7B, "num_hidden_layers": 3, "tie_word_embeddings": True}, ["q_proj"])
    untied = shape_from_arch("u", {**LLAMA_7B, "num_hidden_layers": 3}, ["q_proj"])
    assert untied.params - tied.params == 32000 * 4096  # a tied LM head is the embedding, counted once


@pytest.mark.parametrize("name", ["spp", "lora", "sparse_lora", "masked_full", "norms", "none"])
def test_trainable_parameters_per_adapter_method(shape70, name):
    h, i, kv, layers = 8192, 28672, 1024, 80
    dims = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]  # (out, in): q k v o gate up down
    expected = {"spp": sum(16 * n + m for m, n in dims) * layers, "lora": sum(16 * (n + m) for m, n in dims) * layers,
                "sparse_lora": sum(16 * (n + m) for m, n in dims) * layers,
                "masked_full": sum(m * n for m, n in dims) * layers,
                "norms": 2 * h * layers + h,  # two RMSNorms per block and the final one; LLaMA has no bias
                "none": 0}[name]
    values = {"r": 16} if name in ("spp", "lora", "sparse_lora") else {}
    spec = _adapter(shape70, name, **values)
    assert spec.trainable == expected and spec.trains == (name != "none")
    own = name in ("masked_full", "norms")  # they train the model's own tensors, in its dtype (bf16)
    assert spec.trainable_bytes == expected * (2 if own else 4) and spec.added_bytes == (0 if own else 4 * expected)
    q_only = _adapter(shape70, "spp", r=16, use_beta=False, alpha_init="zeros", targets=["q_proj"])
    assert q_only.trainable == 16 * h * layers


def test_weights_are_sharded_under_fsdp2_and_zero3_and_replicated_otherwise(shape70):
    w = shape70.weight_bytes
    for strategy, stage, sharded in (("fsdp", 2, True), ("deepspeed", 3, True), ("deepspeed", 2, False),
                                     ("ddp", 2, False), ("single", 2, False)):
        terms = fit_device_bytes(_spec(shape70, strategy=strategy, zero_stage=stage, devices=8), GPU_NODE)
        assert terms["weights"] == (w // 8 if sharded else w), strategy
        assert ("gathered" in terms) == sharded  # two blocks and the unsharded root while computing
        if sharded:
            assert terms["gathered"] == 2 * shape70.block_bytes + 2 * 32000 * 8192 * 2 + 8192 * 2


def test_optimizer_state_follows_the_strategy(shape70):
    n = _adapter(shape70, "spp", r=16, dropout=0.0).trainable
    ddp = optimizer_terms(_spec(shape70, strategy="ddp", devices=8))
    assert ddp == {"adapter": 4 * n, "gradients": 2 * 4 * n, "optimizer": 2 * 4 * n}  # fp32, DDP buckets
    fsdp = optimizer_terms(_spec(shape70, strategy="fsdp", devices=8))
    assert fsdp["optimizer"] == 2 * 4 * n // 8 and fsdp["adapter"] == 4 * n // 8
    zero = optimizer_terms(_spec(shape70, strategy="deepspeed", zero_stage=3, devices=8))
    assert zero["optimizer"] == 12 * n // 8  # fp32 master + two fp32 moments of the 1/8 partition
    full = optimizer_terms(_spec(shape70, strategy="fsdp", devices=8,
                                 adapter=_adapter(shape70, "masked_full")))
    assert full["adapter"] == 0 and full["optimizer"] == 2 * 2 * shape70.pruned_params // 8  # bf16 moments


def test_checkpointing_keeps_one_block_input_per_block(shape7):
    on, off = (_spec(shape7, train=TrainSpec(micro_batch=8, seqlen=512, checkpointing=c)) for c in (True, False))
    tokens = 8 * 512
    per_block = block_activation_bytes(on)
    assert per_block == 8 * 4096 + 7 * 2 * 4096 + 4 * 2 * 11008  # no dropout: norms, attention, SwiGLU
    assert training_activations(off)["activations"] == 32 * per_block * tokens
    assert training_activations(on)["activations"] == 32 * tokens * 4096 * 2 + per_block * tokens
    assert training_activations(on)["logits"] == tokens * 32000 * (2 + 12)
    dropped = replace(on, adapter=_adapter(shape7, "spp", dropout=0.05))
    assert block_activation_bytes(dropped) - per_block == (6 * 4096 + 11008) * 3  # inputs of the 7 linears + masks


def test_a_frozen_base_has_no_weight_gradient(shape7):
    n = matmul_params(shape7)
    lora = train_flops(_spec(shape7, train=TrainSpec(tokens_per_example=0),
                             adapter=_adapter(shape7, "lora", r=16)))
    assert lora["forward"] + lora["backward"] == 4 * n  # no attention at 0 tokens of context
    assert lora["adapter"] == 6 * sum(16 * (o + i) for o, i in shape7.block_linears.values()) * 32
    spp = train_flops(_spec(shape7, train=TrainSpec(tokens_per_example=0)))
    adapted = shape7.pruned_params
    assert spp["adapter"] == 2 * adapted  # G = gᵀx for every adapted linear: SPP costs like a weight gradient
    assert train_flops(_spec(shape7, train=TrainSpec(tokens_per_example=0),
                             adapter=_adapter(shape7, "spp", dropout=0.1)))["adapter"] == 6 * adapted


def test_eval_placement_rule():
    gib = GIB
    assert eval_placement(13 * gib, 80 * gib, 8, 1).how == "data_parallel"
    seven = eval_placement(13 * gib, 80 * gib, 8, 2)
    assert (seven.replicas, seven.gpus_per_replica) == (16, 1)
    seventy = eval_placement(int(128.5 * gib), 80 * gib, 8, 1, block_bytes=int(1.6 * gib))
    assert (seventy.how, seventy.replicas, seventy.gpus_per_replica) == ("parallelize", 2, 4)
    assert "4 GPUs" in seventy.reason
    assert eval_placement(int(128.5 * gib), 80 * gib, 1, 1).how == "cpu"  # one GPU cannot hold it
    assert eval_placement(10 * gib, None, 8, 1).how == "cpu"
    at_edge = int(WEIGHT_SHARE * 80 * gib)
    assert eval_placement(at_edge, 80 * gib, 8, 1).how == "data_parallel"
    assert eval_placement(at_edge + 1, 80 * gib, 8, 1).how == "parallelize"
    assert eval_placement(30 * gib, 80 * gib, 8, 1, activation_bytes=60 * gib).gpus_per_replica == 2  # the batch


def test_plan_of_70b_on_8_gpus_fits_and_one_gpu_is_refused_with_a_fix(shape70):
    spec = _spec(shape70, strategy="fsdp", devices=8, eval=EvalSpec(ppl_windows=160, seqlen=2048, lm_eval_batch=8,
                                                                   lm_eval_tokens=10**6))
    plan = plan_run(spec, GPU_NODE)
    assert [p.name for p in plan.phases] == ["load", "prune", "fit", "export", "evaluate"]
    assert not problems(plan) and plan.peak_device_bytes <= 72 * GIB
    one = plan_run(replace(spec, strategy="single", devices=1), GPU_NODE)
    found = problems(one)
    assert [(p.phase, p.memory) for p in found] == [("fit", "GPU"), ("evaluate", "GPU")]  # 128 GiB on one GPU
    text, key = fix(one, found[0])
    assert text.startswith("set strategy=fsdp trainer.devices=2") and key == "strategy"


def test_cpu_runs_count_device_terms_in_the_processes(shape7):
    plan = plan_run(_spec(shape7, kind="cpu", act_bytes=4, devices=2, strategy="ddp"), CPU_HOST)
    fit = plan.phase("fit")
    assert fit.device == {} and fit.rank["weights"] == shape7.weight_bytes  # a DDP replica in every process
    assert fit.rank["heap_retention"] > 0 and plan.placement.how == "cpu"


def test_a_run_whose_model_cannot_be_planned_is_not_refused(tmp_path):
    from train_helpers import tiny_job

    from spp.planning.job import check_job
    from spp.preflight.model_files import model_arch

    job = tiny_job(tmp_path)
    assert check_job(job, model_arch(job.model)) is not None  # the tiny CPU run is planned and fits
    arch = {**model_arch(job.model), "model_type": "no_such_model"}
    assert check_job(job, arch) is None  # transformers cannot build it: logged, not checked


@pytest.mark.parametrize("family", [[], ["+model.arch.model_type=gpt2"]], ids=["llama", "gpt2"])
def test_a_job_that_cannot_fit_is_refused_in_one_line_in_every_family(tmp_path, family):
    """GPT-2's config.json names its shape n_layer / n_embd / n_head: the check reads them as transformers does."""
    from train_helpers import tiny_job

    from spp.planning.job import check_job, missing_shape
    from spp.preflight.model_files import model_arch

    job = tiny_job(tmp_path, *family)
    arch = model_arch(job.model)
    assert ("n_layer" in arch) == bool(family) and missing_shape(arch) == []
    assert check_job(job, arch) is not None  # negative control: the tiny run fits this machine
    small = tiny_job(tmp_path, *family, "trainer.host_memory_gib=0.001")
    with pytest.raises(UserError, match="trainer.host_memory_gib=0.001") as err:
        check_job(small, arch)
    assert "\n" not in str(err.value)
    assert missing_shape({"model_type": "gpt2", "n_embd": 64}) == ["num_attention_heads", "num_hidden_layers",
                                                                     "vocab_size"]
    assert missing_shape({}) == ["hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                                 "vocab_size"]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_gguf_header_gives_the_shape_and_context_over_the_model_group(kind, tmp_path):
    """A GGUF file's header (written here, no tensors) is read under config.json's names, its vocabulary included,
    over the model group's ``arch`` (here another model's): the plan and the context check see the file's model."""
    from gguf import GGUFWriter

    from spp.models.config import ModelConfig
    from spp.planning.job import missing_shape
    from spp.planning.shapes import arch_config
    from spp.preflight.model_files import model_arch
    from spp.preflight.shapes import check_shapes

    writer = GGUFWriter(str(tmp_path / "model.gguf"), kind)
    for add, value in ((writer.add_context_length, 64), (writer.add_embedding_length, 64), (writer.add_block_count, 2),
                       (writer.add_head_count, 4), (writer.add_feed_forward_length, 128), (writer.add_vocab_size, 260)):
        add(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    arch = model_arch(ModelConfig(path=str(tmp_path / "model.gguf"), arch={"vocab_size": 49152}))
    assert missing_shape(arch) == [] and arch["vocab_size"] == 260
    config = arch_config(arch)
    assert (config.max_position_embeddings, config.num_hidden_layers, config.hidden_size) == (64, 2, 64)
    check_shapes(arch, seqlens={"eval.seqlen": 64})  # negative control: the context itself passes
    with pytest.raises(UserError, match="eval.seqlen=65 exceeds the model's max_position_embeddings=64"):
        check_shapes(arch, seqlens={"eval.seqlen": 65})


@pytest.mark.parametrize(("family", "width"), [({}, 128), ({"model_type": "gpt2", "n_inner": 96}, 96),
                                               ({"model_type": "gpt2", "n_inner": None}, 4 * 64),
                                               ({"model_type": "opt", "ffn_dim": 160}, 160)],
                         ids=["llama", "gpt2", "gpt2-default", "opt"])
def test_the_mlp_width_is_read_under_every_familys_name(family, width):
    """GPT-2 calls the MLP width ``n_inner`` (``None``: 4 x ``n_embd``), OPT ``ffn_dim``: the plan's activations
    count it as LLaMA's ``intermediate_size``, not as 0."""
    from spp.models.tiny import tiny_config

    arch = {k: v for k, v in tiny_config(**family).to_dict().items() if family == {} or k != "intermediate_size"}
    assert shape_from_arch("tiny", arch, list(DEFAULT_TARGETS)).intermediate == width


def test_a_dense_teacher_adds_its_weights_outputs_forward_and_host_copy(shape7):
    """``objective=distill``: the teacher's weights (1/N under FSDP2, a replica otherwise, ZeRO-3 included), its
    logits, the KL's fp32 terms and, with the feature term, every block's output; one more forward per token;
    rank 0's host copy from load to placement. Nothing without a training adapter."""
    w, tokens, vocab, hidden = shape7.weight_bytes, 8 * 512, 32000, 4096
    base = _spec(shape7)
    for strategy, stage, devices, weights in (("single", 2, 1, w), ("ddp", 2, 8, w), ("fsdp", 2, 8, w // 8),
                                              ("deepspeed", 3, 8, w)):
        spec = replace(base, strategy=strategy, zero_stage=stage, devices=devices, teacher="block_outputs")
        terms = fit_device_bytes(spec, GPU_NODE)
        assert terms["teacher_weights"] == weights, strategy
        assert terms["teacher_logits"] == tokens * vocab * 2 and terms["distill_kl"] == tokens * vocab * 16
        assert terms["teacher_block_outputs"] == 32 * tokens * hidden * 2
    logits_only = fit_device_bytes(replace(base, teacher="logits"), GPU_NODE)
    assert "teacher_block_outputs" not in logits_only and "teacher_weights" in logits_only
    assert not {k for k in fit_device_bytes(base, GPU_NODE) if "teacher" in k or "distill" in k}
    flops = train_flops(replace(base, teacher="logits"))
    assert flops["teacher_forward"] == 2 * matmul_params(shape7) + 2 * 192 * hidden * 32
    assert "teacher_forward" not in train_flops(base)
    plan = plan_run(replace(base, teacher="logits"), GPU_NODE)
    assert plan.phase("prune").rank0["dense_teacher_copy"] == w and plan.phase("fit").rank0["teacher_placement"] == w
    none = replace(base, teacher="logits", adapter=_adapter(shape7, "none"))
    assert "dense_teacher_copy" not in plan_run(none, GPU_NODE).phase("prune").rank0
