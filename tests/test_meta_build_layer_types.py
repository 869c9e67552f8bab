"""The preflight builds every family's decoder block on the meta device, including configs with per-layer lists
(Qwen2/Qwen3/Gemma-2's ``layer_types``): a bad adapter rank or N:M group size is refused in one line before any
weight is built or read, as for LLaMA."""

from __future__ import annotations

import json

import pytest
import transformers
from train_helpers import tiny_job

import spp.models.tiny
from spp.errors import UserError
from spp.planning.shapes import per_layer_fields, shape_from_arch, skeleton_from_arch
from spp.preflight.jobs import preflight_train
from spp.preflight.model_files import model_arch
from spp.preflight.shapes import arch_layers
from spp.projections import decoder_layers

FAMILIES = ["tiny_qwen2", "tiny_qwen3", "tiny_gemma2"]


@pytest.fixture
def no_weights(monkeypatch):
    """Building or reading a model's weights anywhere fails the test."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("model weights were built or loaded")

    monkeypatch.setattr(spp.models.tiny, "tiny_model", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize("group", FAMILIES)
def test_layer_types_families_build_on_meta(group, tmp_path):
    job = tiny_job(tmp_path, f"model={group}")
    arch = model_arch(job.model)
    assert len(arch["layer_types"]) == arch["num_hidden_layers"] == 2  # the config that used to fail
    layers = arch_layers(arch)
    assert layers is not None and layers.kind == arch["model_type"]


@pytest.mark.parametrize("group", FAMILIES)
@pytest.mark.parametrize("bad, key", [("adapter.r=48", "adapter.r"), ("sparsity.m=48", "sparsity.m")])
def test_bad_shape_refused_in_one_line_before_any_weight(group, bad, key, tmp_path, no_weights):
    job = tiny_job(tmp_path, f"model={group}", "adapter=spp", bad)
    with pytest.raises(UserError) as err:
        preflight_train(job)
    assert err.value.key == key and "\n" not in str(err.value)


def test_a_saved_qwen2_folder_with_layer_types_builds_and_plans(tmp_path):
    """A real ``config.json`` (28 blocks, with ``layer_types``) builds its 1- and 2-block skeletons; the cut keeps
    the first blocks' kinds and leaves token-id lists alone."""
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=28, vocab_size=260,
                                      eos_token_id=list(range(28)))
    config.layer_types = ["sliding_attention"] + ["full_attention"] * 27
    config.save_pretrained(tmp_path)
    arch = json.loads((tmp_path / "config.json").read_text())
    fields = per_layer_fields(arch, 2)
    assert fields["layer_types"] == ["sliding_attention", "full_attention"] and fields["eos_token_id"] == arch[
        "eos_token_id"]
    _, blocks = decoder_layers(skeleton_from_arch(arch, 2))
    assert len(blocks) == 2
    assert arch_layers(arch) is not None
    shape = shape_from_arch("qwen2-28", arch, ["q_proj"])
    assert shape.blocks == 28 and shape.linears["self_attn.q_proj"] == (64, 64)


def test_a_saved_gpt2_folder_plans_its_n_layer_blocks(tmp_path):
    """GPT-2's ``config.json`` names its depth ``n_layer`` (transformers maps ``num_hidden_layers`` to it): the plan
    counts its 12 blocks, not the 32 of a LLaMA default."""
    config = transformers.GPT2Config(n_embd=64, n_inner=128, n_layer=12, n_head=4, vocab_size=260, bos_token_id=0,
                                     eos_token_id=0)
    config.save_pretrained(tmp_path)
    arch = json.loads((tmp_path / "config.json").read_text())
    assert "num_hidden_layers" not in arch and arch["n_layer"] == 12
    shape = shape_from_arch("gpt2-12", arch, ["c_attn"])
    assert shape.blocks == 12 and shape.params == transformers.GPT2LMHeadModel(config).num_parameters()


def test_gpt2_prunable_linears_are_all_counted():
    """GPT-2's attention and MLP each hold a ``c_proj``: the plan counts both (keyed by their names in the block),
    so the pruned weights are every projection of every block."""
    arch = spp.models.tiny.tiny_config(model_type="gpt2").to_dict()
    shape = shape_from_arch("tiny-gpt2", arch, ["c_attn", "c_proj", "c_fc"])
    assert shape.pruned_params == shape.blocks * (192 * 64 + 64 * 64 + 128 * 64 + 64 * 128)
    assert shape.linears == shape.block_linears and len(shape.linears) == 4
