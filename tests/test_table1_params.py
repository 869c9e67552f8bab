"""Parameter accounting against paper Table 1 and the per-layer formula m + r n."""

from __future__ import annotations

import pytest

from lab.table1_params import (
    TABLE1_MODELS,
    count_method_parameters,
    count_spp_parameters,
    main,
    markdown_table,
    methods_table,
    model_arch,
)

# Paper Table 1 (r = 16): trainable, all parameters, per mille.
TABLE1 = {
    "llama7b": ("2.0e+07", "6.8e+09", "2.90"),
    "llama13b": ("3.1e+07", "1.3e+10", "2.35"),
    "llama30b": ("6.0e+07", "3.3e+10", "1.83"),
    "llama65b": ("9.8e+07", "6.5e+10", "1.50"),
    "llama2_7b": ("2.0e+07", "6.8e+09", "2.90"),
    "llama2_13b": ("3.1e+07", "1.3e+10", "2.35"),
    "llama2_70b": ("1.1e+08", "6.9e+10", "1.54"),
}


@pytest.mark.parametrize("name", TABLE1_MODELS)
def test_table1_values(name):
    row = count_spp_parameters(name, r=16)
    assert (f"{row.trainable:.1e}", f"{row.total:.1e}", f"{row.per_mille:.2f}") == TABLE1[name]


@pytest.mark.parametrize("r", [4, 16])
def test_trainable_follows_m_plus_rn(r):
    cfg = model_arch("llama2_70b")
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = h // cfg.num_attention_heads * cfg.num_key_value_heads
    per_layer = 2 * (h + r * h) + 2 * (kv + r * h) + 2 * (i + r * h) + (h + r * i)
    assert count_spp_parameters("llama2_70b", r=r).trainable == layers * per_layer


def test_cli_prints_markdown(capsys):
    main(["--r", "16", "--models", "llama7b"])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "| model | r | trainable | all | ‰ |"
    assert out[2] == "| llama7b | 16 | 2.0e+07 | 6.8e+09 | 2.90 |"
    assert markdown_table([]).count("\n") == 1


def test_unknown_model_names_known_ones():
    with pytest.raises(FileNotFoundError, match="known models: .*llama7b"):
        model_arch("llama9b")


def _projection_shapes(name: str) -> list[tuple[int, int]]:
    """(out, in) of the 7 projections of every decoder block of ``name``."""
    cfg = model_arch(name)
    h, i = cfg.hidden_size, cfg.intermediate_size
    kv = h // cfg.num_attention_heads * cfg.num_key_value_heads
    return [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)] * cfg.num_hidden_layers


@pytest.mark.parametrize("r", [4, 8])
def test_sparse_lora_has_loras_count_r_times_m_plus_n(r):
    expected = sum(r * (m + n) for m, n in _projection_shapes("llama2_70b"))
    lora = count_method_parameters("llama2_70b", "lora", r=r)
    sparse = count_method_parameters("llama2_70b", "sparse_lora", r=r)
    assert lora.trainable == sparse.trainable == expected
    assert lora.total == sparse.total == count_spp_parameters("llama2_70b", r=r).total - count_spp_parameters(
        "llama2_70b", r=r).trainable + expected


@pytest.mark.parametrize("sparsity", [0.5, 0.7])
def test_masked_full_counts_the_kept_weights(sparsity):
    row = count_method_parameters("llama7b", "masked_full", sparsity=sparsity)
    assert row.trainable == sum(round(m * n * (1 - sparsity)) for m, n in _projection_shapes("llama7b"))
    assert row.total == count_spp_parameters("llama7b").total - count_spp_parameters("llama7b").trainable
    assert row.r == 0 and f"{row.per_mille:.0f}" == f"{1000 * row.trainable / row.total:.0f}"


def test_cli_prints_the_method_table(capsys):
    main(["--models", "llama7b", "--methods", "sparse_lora", "masked_full"])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[4] == "| model | method | r | trainable | all | ‰ |"
    assert out[6].startswith("| llama7b | sparse_lora | 8 | 2.0e+07 |")
    assert out[7].startswith("| llama7b | masked_full | - | 3.2e+09 |")
    assert methods_table([]).count("\n") == 1
    with pytest.raises(ValueError, match="use one of"):
        count_method_parameters("llama7b", "dense")
