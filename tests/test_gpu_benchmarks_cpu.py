"""CPU-safe paths of the GPU benchmarks: floors, argument checks, tiny CPU runs, skips without CUDA."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import gpu_exactness, gpu_sparse24, gpu_step_bench
from benchmarks.gpu_step_bench import (
    SHAPES,
    Arch,
    add_rate_floor,
    extrapolate,
    floor_ratio,
    kernel_category,
    layer_floor_ratio,
    magnitude_2_4_,
    make_step,
    products_per_linear,
    share_copy,
    step_macs,
    summarize_kernels,
)
from spp.adapters.methods.spp.layer import SPPLinear
from spp.adapters.methods.spp.model import inject
from spp.export.semi_structured import count_2_4_violations
from spp.models.tiny import tiny_llama


def test_floor_at_7b_matches_an_independent_count() -> None:
    a = SHAPES["7b"]
    h, f, v, n = 4096, 11008, 32000, 2048
    lin = 32 * (4 * h * h + 3 * h * f)  # MACs per token, one product of every projection of every block
    shared = 32 * 6 * n * h + 2 * v * h  # attention (2 fwd + 4 bwd) + LM head (fwd + input grad)
    for p, spp_products in ((0.0, 3), (0.05, 5)):
        want = (spp_products * lin + shared) / (2 * lin + shared)
        assert floor_ratio(a, 32, 1, n, "spp-fused", p, False) == pytest.approx(want, rel=1e-12)
    # the expected figure: "about 1.4x without dropout and 2.3x with dropout 0.05" at 7B, sequence 2048
    assert 1.40 < floor_ratio(a, 32, 1, n, "spp-fused", 0.0, False) < 1.47
    assert 2.25 < floor_ratio(a, 32, 4, n, "spp-naive", 0.05, False) < 2.35
    assert floor_ratio(a, 32, 4, n, "frozen", 0.05, True) == 1.0


def test_products_per_linear_and_checkpointing() -> None:
    assert products_per_linear("lora", 0.05) == products_per_linear("frozen", 0.0) == 2
    assert products_per_linear("spp-fused", 0.0) == 3 and products_per_linear("spp-blocked", 0.05) == 5
    assert products_per_linear("sparse_lora", 0.0) == 5
    assert products_per_linear("spp-naive", 0.0, checkpointing=True) == 4  # forward product recomputed
    assert products_per_linear("spp-naive", 0.05, checkpointing=True) == 7
    assert layer_floor_ratio("spp-fused", 0.0) == 1.5 and layer_floor_ratio("spp-fused", 0.05) == 2.5
    with pytest.raises(ValueError, match="no floor for variant"):
        products_per_linear("dora", 0.0)
    a = SHAPES["tiny"]
    extra = step_macs(a, 2, 1, 8, "lora", 0.0, True) - step_macs(a, 2, 1, 8, "lora", 0.0, False)
    assert extra == 8 * 2 * (sum(o * i for o, i in a.linear_shapes()) + 2 * 8 * a.hidden)


def test_llama_7b_parameter_count() -> None:
    assert SHAPES["7b"].params() == 6_738_415_616  # LLaMA-7B (untied embeddings)
    assert SHAPES["tiny"].kv_dim == 32


def test_step_bench_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        gpu_step_bench.parse_args(["--blocks", "4", "4"])
    with pytest.raises(SystemExit):
        gpu_step_bench.parse_args(["--dropout", "1.0"])
    with pytest.raises(SystemExit):
        gpu_exactness.parse_args(["--steps", "1"])
    with pytest.raises(SystemExit):
        gpu_sparse24.parse_args(["--blocks", "0"])
    args = gpu_sparse24.parse_args(["--decode-batch"])
    assert args.decode_batch == [] and args.backends == ["cusparselt", "cutlass"]


def test_kernel_categories() -> None:
    assert kernel_category("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert kernel_category("sm90_xmma_sparse_gemm_bf16bf16_bf16f32_f32_tn_t") == "gemm"
    assert kernel_category("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kernel_category("void at::native::vectorized_elementwise_kernel<8, addcmul>") == "other"
    s = summarize_kernels({"nvjet_a": 3000.0, "flash_b": 1000.0, "elementwise_c": 2000.0}, steps=2, top=2)
    assert s["ms_per_step"] == {"gemm": 1.5, "attention": 0.5, "other": 1.0} and s["total_ms"] == 3.0
    assert [k["name"] for k in s["top_kernels"]] == ["nvjet_a", "elementwise_c"]


def test_magnitude_2_4_keeps_the_two_largest_of_every_four() -> None:
    model = nn.Module()
    model.q_proj = nn.Linear(32, 8, bias=False)
    model.lm_head = nn.Linear(32, 8, bias=False)
    w0, head0 = model.q_proj.weight.detach().clone(), model.lm_head.weight.detach().clone()
    assert magnitude_2_4_(model) == 1
    w = model.q_proj.weight.detach()
    assert count_2_4_violations(w) == 0 and int((w == 0).sum()) == w.numel() // 2
    g, kept = w0.abs().reshape(8, -1, 4), (w != 0).reshape(8, -1, 4)
    assert torch.all(g[kept].reshape(8, -1, 2).min(-1).values >= g[~kept].reshape(8, -1, 2).max(-1).values)
    assert torch.equal(w[w != 0], w0[w != 0]) and torch.equal(model.lm_head.weight, head0)


def test_share_copy_shares_weights_but_not_modules() -> None:
    base = tiny_llama()
    copy_ = share_copy(base)
    assert all(p is q for p, q in zip(base.parameters(), copy_.parameters(), strict=True))
    inject(copy_, r=16)
    assert not any(isinstance(m, SPPLinear) for m in base.modules())
    assert copy_.model.layers[0].self_attn.q_proj.base.weight is base.model.layers[0].self_attn.q_proj.weight


def test_tiny_step_trains_only_the_adapter() -> None:
    model = inject(gpu_step_bench.cut_model(SHAPES["tiny"], 2, torch.float32, torch.device("cpu")), r=16,
                   dropout=0.0)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    ids = torch.randint(0, 260, (2, 16), generator=torch.Generator().manual_seed(0))
    step = make_step(model.train(), {"input_ids": ids, "labels": ids}, torch.bfloat16)
    with torch.no_grad():
        before = model(input_ids=ids, labels=ids).loss.item()
    for _ in range(5):
        step()
    with torch.no_grad():
        after = model(input_ids=ids, labels=ids).loss.item()
    assert after < before
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert any(float(p.detach().abs().max()) > 0 for n, p in model.named_parameters() if n.endswith("spp_beta"))


def test_extrapolation_is_linear_in_blocks() -> None:
    arch = Arch(hidden=64, ffn=128, heads=4, kv_heads=4, vocab=100, layers=10)

    def group(nb: int) -> dict:
        res = {n: {"time_s": 1.0 + k * nb, "peak_mib": 10.0 + 2 * k * nb, "trainable_params": 100 * nb}
               for k, n in ((1, "lora"), (2, "spp-fused"))}
        return {"g": {"batch": 1, "seq": 8, "dropout": 0.0, "checkpointing": False, "results": res}}

    out = extrapolate({2: group(2), 4: group(4)}, arch, torch.bfloat16)
    rows = out["g"]
    assert rows["lora"]["time_s"] == pytest.approx(1 + 10) and rows["spp-fused"]["time_s"] == pytest.approx(1 + 20)
    assert rows["spp-fused"]["step_peak_mib"] == pytest.approx(10 + 40)
    assert rows["spp-fused"]["time_ratio"] == pytest.approx(21 / 11)
    assert out["weights_mib"] == pytest.approx(arch.params() * 2 / 2**20)
    assert rows["lora"]["total_peak_mib"] == pytest.approx(out["weights_mib"] + 1000 * 12 / 2**20 + 30)


def test_rate_floor() -> None:
    res = {"frozen": {"matmul_tflops": 400.0}, "lora": {"matmul_tflops": 200.0}}
    add_rate_floor(res)
    assert res["frozen"]["time_over_frozen_rate"] == 1.0 and res["lora"]["time_over_frozen_rate"] == 2.0


def test_tiny_cpu_run_of_the_step_benchmark(tmp_path) -> None:
    out = tmp_path / "step.json"
    payload = gpu_step_bench.main(["--device", "cpu", "--shape", "tiny", "--blocks", "1", "2", "--seq", "16",
                                   "--batch", "1", "--dropout", "0.05", "--repeats", "1", "--warmup", "0",
                                   "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["shape"] == "tiny" and set(saved["model"]) == {"1", "2"}
    group = saved["model"]["2"]["b1_ckpt1_p0.05"]["results"]
    assert {"frozen", "lora", "spp-fused", "spp-naive", "spp-blocked"} <= set(group)
    assert group["lora"]["time_ratio"] == 1.0 and group["spp-fused"]["floor_ratio"] > 1.0
    assert "b1_ckpt0_p0.05" in payload["full_model_extrapolated"]
    assert "layers" not in saved  # no single-layer part for the tiny shape


def test_cpu_formula_matches_the_layer_merge_in_float64() -> None:
    lin = nn.Linear(16, 32, bias=False).double()
    layer = SPPLinear(lin, r=4, beta_init="kaiming")
    ref = gpu_exactness.cpu_formula(lin.weight, layer.spp_alpha, layer.spp_beta, layer.scale)
    layer.merge()
    assert torch.allclose(lin.weight, ref, rtol=1e-6, atol=0)  # SPPLinear.merge forms the factor in fp32


def test_exactness_pipeline_on_cpu(tmp_path) -> None:
    out = tmp_path / "ex.json"
    payload = gpu_exactness.main(["--device", "cpu", "--cases", "bf16_weights_autocast_bf16", "--steps", "3",
                                  "--out", str(out)])
    case = payload["cases"]["bf16_weights_autocast_bf16"]
    assert payload["all_passed"] and all(case["checks"].values())
    assert case["zeros_lost_after_merge"] == 0 and case["pruned_zeros"] == case["weights"] // 2
    assert case["max_err_ulps_vs_cpu_formula"] <= 1.0
    assert json.loads(out.read_text())["all_passed"]


def test_flattened_linear_matches_and_is_contiguous() -> None:
    lin = nn.Linear(8, 6)
    x = torch.randn(3, 5, 8)
    gpu_sparse24.flatten_inputs(nn.ModuleDict({"p": lin}), ["p"])
    y = lin(x.transpose(0, 1))  # 3-D input with leading dimensions that do not fold
    assert y.is_contiguous() and torch.allclose(y, F.linear(x.transpose(0, 1), lin.weight, lin.bias))


@pytest.mark.parametrize("module", [gpu_step_bench, gpu_exactness, gpu_sparse24])
def test_scripts_skip_clearly_without_cuda(module, monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    payload = module.main([])
    assert set(payload) == {"skipped"} and "no CUDA device" in payload["skipped"]
    assert "skipped: no CUDA device" in capsys.readouterr().out
