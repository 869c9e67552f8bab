"""The model groups of today's architectures (``conf/model/{llama3_1_8b,qwen2_5_7b,mistral_7b,gemma2_9b}.yaml``)
compose, pass the preflight and plan from their ``arch`` block alone (no weight exists here, none is read), and
the plan's sizes are the published ones: the parameter count within 1 % of the model card's, Gemma-2's q_proj
``4096 x 3584`` (``head_dim`` 256, not hidden / heads), Qwen2's q/k/v biases, a tied LM head counted once."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers
from accelerate import init_empty_weights
from train_helpers import compose_train

from spp.errors import UserError
from spp.paths import SAMPLE_DATA_DIR
from spp.planning.job import plan_output
from spp.planning.shapes import shape_from_arch
from spp.preflight.jobs import preflight_train
from spp.preflight.shapes import arch_layers
from spp.projections import DEFAULT_TARGETS, decoder_layers
from spp.training.config import load_job
from spp.training.strategies import decoder_layer_class

GIB = 2**30
PUBLIC_PARAMS = {"llama3_1_8b": 8.03e9, "qwen2_5_7b": 7.62e9, "mistral_7b": 7.24e9, "gemma2_9b": 9.24e9}
"""Parameter counts the model cards state (Llama-3.1-8B 8.03 B, Qwen2.5-7B 7.62 B, Mistral-7B 7.24 B,
Gemma-2-9B 9.24 B)."""
Q_PROJ = {"llama3_1_8b": (4096, 4096), "qwen2_5_7b": (3584, 3584), "mistral_7b": (4096, 4096),
          "gemma2_9b": (4096, 3584)}
"""``(out_features, in_features)`` of q_proj: heads x head_dim by hidden."""
KV_OUT = {"llama3_1_8b": 8 * 128, "qwen2_5_7b": 4 * 128, "mistral_7b": 8 * 128, "gemma2_9b": 8 * 256}
"""k_proj's / v_proj's out_features: key-value heads x head_dim (grouped-query attention in all four)."""
GPU_RUN = ["trainer.accelerator=gpu", "trainer.device_memory_gib=80", "trainer.host_memory_gib=2048"]


@pytest.fixture(autouse=True)
def no_weights(monkeypatch):
    """A weight loader called anywhere fails the test (there are no weights here, and there is no network)."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("model weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))


def _job(group: str, tmp: Path, *extra: str):
    return load_job(compose_train([f"model={group}", f"run_dir={tmp / 'run'}", f"cache_dir={tmp / 'cache'}",
                                   f"data_dir={SAMPLE_DATA_DIR}", *extra]))


@pytest.mark.parametrize("group", list(PUBLIC_PARAMS))
def test_group_composes_with_the_paper_7b_defaults_and_its_decoder_layer(group, tmp_path):
    job = _job(group, tmp_path)
    assert job.model.name == group and job.model.torch_dtype == "bfloat16"
    assert (job.trainer.lr, job.data.train_batch_size, job.trainer.max_epochs) == (4e-3, 8, 3)
    arch = dict(job.model.arch)
    config = transformers.AutoConfig.for_model(arch.pop("model_type"), **{**arch, "num_hidden_layers": 1})
    with init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config)
    _prefix, layers = decoder_layers(model)
    assert type(layers[0]) is decoder_layer_class(job.model.decoder_layer_cls)


@pytest.mark.parametrize("group", list(PUBLIC_PARAMS))
def test_preflight_and_plan_read_no_weight_and_give_the_published_sizes(group, tmp_path):
    job = _job(group, tmp_path, *GPU_RUN, "trainer.devices=8", "strategy=fsdp")
    arch = preflight_train(job)  # shapes (SPP's r | out_features, 2:4 | in_features), targets, memory plan
    _text, plan = plan_output(job, arch)
    assert abs(plan["params"] / PUBLIC_PARAMS[group] - 1) < 0.01, plan["params"]
    assert plan["weight_bytes"] == 2 * plan["params"]  # bf16
    assert plan["problems"] == [] and plan["peak_device_bytes"] < 80 * GIB  # FSDP2 on 8 x 80 GiB fits
    shapes = arch_layers(arch).shapes(list(DEFAULT_TARGETS), "pruner.targets")  # the preflight's (in, out)
    assert shapes["self_attn.q_proj"] == Q_PROJ[group][::-1]
    assert shapes["self_attn.k_proj"] == (Q_PROJ[group][1], KV_OUT[group])
    shape = shape_from_arch(group, arch, list(DEFAULT_TARGETS))  # the plan's (out, in)
    assert shape.linears["self_attn.q_proj"] == Q_PROJ[group]
    assert shape.linears["self_attn.v_proj"] == (KV_OUT[group], Q_PROJ[group][1])
    assert shape.linears["self_attn.o_proj"] == Q_PROJ[group][::-1]
    # SPP trains r x in + out per adapted linear (r = 16, the seven projections)
    assert plan["trainable_params"] == shape.blocks * sum(16 * i + o for o, i in shape.linears.values())


def test_biases_tied_heads_and_gemma2_attention_are_counted():
    shapes = {g: shape_from_arch(g, dict(load_job(compose_train([f"model={g}"])).model.arch), list(DEFAULT_TARGETS))
              for g in PUBLIC_PARAMS}
    weights = {g: sum(o * i for o, i in s.block_linears.values()) for g, s in shapes.items()}
    norms = {g: s.norms_per_block * s.hidden for g, s in shapes.items()}
    assert shapes["qwen2_5_7b"].block_params - weights["qwen2_5_7b"] - norms["qwen2_5_7b"] == 3584 + 2 * 512
    for group in ("llama3_1_8b", "mistral_7b", "gemma2_9b"):  # no bias
        assert shapes[group].block_params == weights[group] + norms[group]
    gemma = shapes["gemma2_9b"]
    assert gemma.outside_params == gemma.embedding_params + gemma.hidden == 256000 * 3584 + 3584  # tied head once
    llama3 = shapes["llama3_1_8b"]
    assert llama3.outside_params == 2 * llama3.embedding_params + llama3.hidden  # its own LM head
    assert (gemma.attention_width, gemma.norms_per_block, gemma.eager_attention) == (4096, 4, True)
    assert gemma.score_bytes(512, 2) == 16 * 512 * (4 + 2 * 2)  # fp32 softmax, its bf16 cast, tanh (softcap)
    assert (llama3.attention_width, llama3.norms_per_block, llama3.eager_attention) == (4096, 2, False)


@pytest.mark.parametrize("group", list(PUBLIC_PARAMS))
def test_one_gpu_plan_refuses_only_gemma2_with_a_fix(group, tmp_path):
    """One 80 GiB GPU without activation checkpointing: the 7-8 B models fit; Gemma-2-9B's eager attention scores
    and 256k-entry logits do not, and the preflight refuses it in one line with a setting that fits."""
    job = _job(group, tmp_path, *GPU_RUN)
    if group == "gemma2_9b":
        with pytest.raises(UserError, match=r"the fit phase of gemma2_9b .* — set "):
            preflight_train(job)
    _text, plan = plan_output(job, dict(job.model.arch))
    fit = next(p for p in plan["phases"] if p["name"] == "fit")
    assert fit["device_bytes"] > plan["weight_bytes"]  # a replica of the weights plus activations
    assert [p["phase"] for p in plan["problems"]] == (["fit"] if group == "gemma2_9b" else [])
