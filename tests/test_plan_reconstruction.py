"""The run plan's reconstruct phase (``reconstruct=blockwise``, ``spp.planning.reconstruction``): its terms against
independent formulas and a real formed block, the preflight's one-line refusal, the committed one-GPU table of the
paper's models, and (slow) the phase against the peak RSS of real 1- and 2-process runs on this CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spp_helpers import prune_2_4_
from train_helpers import compose_train

from benchmarks import plan_rss_reconstruct as bench
from benchmarks.run_plan import (
    DOC_PATH,
    MODELS,
    RECONSTRUCT_BEGIN,
    RECONSTRUCT_DTYPES,
    RECONSTRUCT_END,
    RECONSTRUCT_JSON,
    as_text,
    reconstruct_markdown,
    reconstruct_rows,
)
from lab.bench.common import replace_between
from spp.errors import UserError
from spp.models.tiny import tiny_config, tiny_model
from spp.paths import REPO_ROOT
from spp.planning.hardware import GPU_NODE
from spp.planning.job import check_job, plan_job
from spp.planning.reconstruction import HIDDEN_SETS as SETS
from spp.planning.reconstruction import form_tensors
from spp.planning.report import text
from spp.preflight.model_files import model_arch
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.engine import form_config
from spp.pruning.reconstruction.one_block import BLOCK_PATH, FormedBlock
from spp.training.config import load_job

GIB = 2**30
LLAMA7B_LINEARS = 4 * 4096 * 4096 + 3 * 4096 * 11008  # q, k, v, o and gate, up, down of one LLaMA-7B block


def _plan(*overrides: str, hw=GPU_NODE):
    job = load_job(compose_train(list(overrides)))
    return job, plan_job(job, model_arch(job.model), "gpu", "hub", hw)


def _phase(plan, name):
    return next(p for p in plan.phases if p.name == name)


def test_the_phase_is_planned_only_with_reconstruct_blockwise_and_holds_the_dense_copy():
    _job, off = _plan("model=llama7b")
    _job, on = _plan("model=llama7b", "reconstruct=blockwise")
    assert [p.name for p in off.phases if p.name == "reconstruct"] == []
    names = [p.name for p in on.phases]
    assert names.index("prune") + 1 == names.index("reconstruct") == names.index("fit") - 1
    weights = on.spec.shape.weight_bytes
    assert _phase(on, "prune").rank0["dense_copy"] == weights and "dense_copy" not in _phase(off, "prune").rank0
    rank0 = _phase(on, "reconstruct").rank0
    assert rank0["weights"] == rank0["dense_copy"] == weights  # the pruned home and the dense copy
    assert "reconstruction: form spp (0.61 M trainable per block), 128 x 2048-token windows" in text(on)
    assert "reconstruction:" not in text(off)


def test_hidden_states_and_the_form_match_independent_formulas():
    """LLaMA-7B on 3 GPUs, SPP r = 16 with beta: 43 of the 128 windows per rank; ``r x in + out`` per linear."""
    _job, plan = _plan("model=llama7b", "reconstruct=blockwise", "trainer.devices=3", "strategy=fsdp")
    device = _phase(plan, "reconstruct").device
    one_set = 43 * 2048 * 4096 * 4
    assert [device[k] for k in SETS] == [one_set] * 4  # the peak is the end moment: four sets
    spp = 4 * (16 * 4096 + 4096) + 2 * (16 * 4096 + 11008) + (16 * 11008 + 4096)
    rc = plan.spec.reconstruct
    assert (rc.trainable_params, rc.trainable_bytes, rc.added_bytes) == (spp, 4 * spp, 4 * spp)  # fp32 alpha, beta
    assert device["block"] == plan.spec.shape.block_params * 4  # onloaded in reconstruct.dtype=float32
    _job, dense = _plan("model=llama7b", "reconstruct=blockwise", "reconstruct.inputs=dense",
                        "reconstruct.dtype=bfloat16")
    terms = _phase(dense, "reconstruct").device
    assert [k for k in SETS if k in terms] == ["dense_inputs", "targets", "block_outputs"]  # inputs are the dense
    assert terms["targets"] == 128 * 2048 * 4096 * 2


@pytest.mark.parametrize("form", ["spp", "masked_full", "norms"])
def test_the_meta_count_is_what_a_real_formed_block_trains(form):
    cfg = form_config(ReconstructConfig(name="blockwise", form=form))
    counted = form_tensors(tiny_config().to_dict(), cfg, "float32")
    model = tiny_model()
    masks = {n: ~z for n, z in prune_2_4_(model).items()}
    block = {f"{BLOCK_PATH}.{n.removeprefix('model.layers.0.')}": m for n, m in masks.items()
             if n.startswith("model.layers.0.")}  # named inside the one-block model, as the engine names them
    params = FormedBlock(model.model.layers[0], cfg, block).attach()
    assert counted["trainable_params"] == sum(p.numel() for p in params) > 0
    assert counted["trainable_bytes"] == sum(p.numel() * p.element_size() for p in params)


def test_time_is_the_flop_formula_over_the_ranks():
    _job, plan = _plan("model=llama7b", "reconstruct=blockwise", "reconstruct.dtype=bfloat16", "trainer.devices=2",
                       "strategy=fsdp")
    forward = 2 * LLAMA7B_LINEARS + 2 * 2048 * 4096  # one token through one block, causal attention
    flops = 32 * 128 * 2048 * forward * (3 * 3 + 3) / 2
    assert _phase(plan, "reconstruct").seconds["train"] == pytest.approx(flops / 300e12)
    _job, fp32 = _plan("model=llama7b", "reconstruct=blockwise", "trainer.devices=2", "strategy=fsdp")
    assert _phase(fp32, "reconstruct").seconds["train"] == pytest.approx(flops / 50e12)  # fp32 at 50 TFLOP/s


def test_a_reconstruction_only_run_plans_no_training_step():
    _job, plan = _plan("model=llama7b", "reconstruct=blockwise", "trainer.max_steps=0")
    fit = _phase(plan, "fit")
    assert set(fit.device) == {"weights", "adapter", "cuda_context"} and fit.seconds["train"] == 0
    _job, trains = _plan("model=llama7b", "reconstruct=blockwise")
    assert {"activations", "gradients", "optimizer"} <= set(_phase(trains, "fit").device)


def test_the_preflight_refuses_a_reconstruction_that_does_not_fit_the_gpu():
    args = ["model=llama7b", "reconstruct=blockwise", "trainer.max_steps=0", "trainer.accelerator=gpu",
            "trainer.host_memory_gib=4096"]
    job = load_job(compose_train([*args, "trainer.device_memory_gib=17"]))
    with pytest.raises(UserError) as err:
        check_job(job, model_arch(job.model))
    text = str(err.value)
    assert "\n" not in text and "the reconstruct phase of llama7b" in text and "17.0 GiB" in text
    assert "set reconstruct.dtype=bfloat16 (planned to fit)" in text
    fixed = load_job(compose_train([*args, "trainer.device_memory_gib=17", "reconstruct.dtype=bfloat16"]))
    assert check_job(fixed, model_arch(fixed.model)) is not None  # the offered setting fits
    roomy = load_job(compose_train([*args, "trainer.device_memory_gib=79.2"]))
    assert check_job(roomy, model_arch(roomy.model)) is not None  # negative control: the default fits 80 GB


@pytest.mark.slow  # train.py's start-up and preflight: 24 s on the loaded 2-core machine
def test_train_py_refuses_in_one_line_before_loading_a_weight(tmp_path: Path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline"}
    cmd = [sys.executable, "train.py", *bench.ARGS, "trainer.accelerator=cpu", "trainer.host_memory_gib=1",
           f"run_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "the reconstruct phase of tiny" in errors[0] and "— set reconstruct." in errors[0]
    assert "loading model" not in proc.stderr + proc.stdout


@pytest.fixture(scope="module")
def rows():
    return reconstruct_rows()


def test_the_committed_one_gpu_table_is_what_the_code_computes(rows):
    assert RECONSTRUCT_JSON.read_text() == as_text(rows), "run: python benchmarks/run_plan.py"
    doc = DOC_PATH.read_text()
    assert replace_between(doc, RECONSTRUCT_BEGIN, RECONSTRUCT_END, reconstruct_markdown(rows)) == doc
    assert len(rows) == len(MODELS) * len(RECONSTRUCT_DTYPES)


def test_every_paper_model_reconstructs_on_one_80_gb_gpu(rows):
    for row in rows:
        phase = next(p for p in row["phases"] if p["name"] == "reconstruct")
        assert [p for p in row["problems"] if p["phase"] == "reconstruct"] == [], row["model"]
        assert phase["device_bytes"] <= 79.2 * GIB and phase["seconds_total"] > 0
    fp32_70b = next(r for r in rows if r["model"] == "llama2_70b" and r["reconstruct_dtype"] == "float32")
    bf16_70b = next(r for r in rows if r["model"] == "llama2_70b" and r["reconstruct_dtype"] == "bfloat16")
    assert [p["phase"] for p in fp32_70b["problems"]] == ["fit", "evaluate"]  # train.py places the whole model
    device = next(p for p in fp32_70b["phases"] if p["name"] == "reconstruct")["device"]
    assert device["targets"] == 128 * 2048 * 8192 * 4
    bf16 = next(p for p in bf16_70b["phases"] if p["name"] == "reconstruct")["device"]
    assert bf16["targets"] == 128 * 2048 * 8192 * 2


def test_the_committed_measured_table_is_the_committed_measurement():
    data = json.loads(bench.JSON_PATH.read_text())
    doc = DOC_PATH.read_text()
    assert replace_between(doc, bench.BEGIN, bench.END, bench.markdown(data)) == doc
    assert [c["case"] for c in data["cases"]] == list(bench.CASES)
    for case in data["cases"]:
        assert case["exit"] == 0 and case["reconstruct_is_the_plans_peak"]
        for rank in case["ranks"].values():
            assert 0.75 <= rank["ratio"] <= 1.25, (case["case"], rank)


@pytest.mark.slow  # two reconstructions of 768 windows at once: 5 min on the 2-core machine at load 7
def test_peak_rss_is_within_25_percent_of_the_reconstruct_phase(tmp_path: Path):
    procs = {name: bench.measure(args, tmp_path / str(i)) for i, (name, args) in enumerate(bench.CASES.items())}
    for i, proc in enumerate(procs.values()):
        assert proc.wait(timeout=1800) == 0, (tmp_path / str(i) / "log").read_text()[-3000:]
    for i, (name, args) in enumerate(bench.CASES.items()):
        rss, plan = bench.measured(tmp_path / str(i)), bench.planned(args)
        assert sorted(rss) == ([0] if "1 process" in name else [0, 1]) and plan["is_peak"], (name, rss)
        for rank, ratio in bench.ratios(rss, plan).items():
            print(f"{name}, rank {rank}: {rss[rank]:.0f} MiB measured, ratio {ratio:.2f}")
            assert abs(ratio - 1) <= 0.25, (name, rank, ratio)
        for rank, ratio in bench.ratios(rss, plan, drop=SETS).items():  # negative control: no hidden states
            assert abs(ratio - 1) > 0.25, (name, rank, ratio)


def test_the_forms_dropout_keeps_each_adapted_input():
    """SPP's default dropout keeps a dropped-out copy of every adapted linear's input: the tiny block's q, k, v, o,
    gate and up read 64 features, down 128; with ``form_options.dropout=0`` nothing is kept."""
    arch = tiny_config().to_dict()
    on = form_tensors(arch, form_config(ReconstructConfig(name="blockwise", form="spp")), "bfloat16")
    off = form_tensors(arch, form_config(ReconstructConfig(name="blockwise", form="spp",
                                                           form_options={"dropout": 0.0})), "bfloat16")
    assert (on["dropout_inputs"], off["dropout_inputs"]) == (6 * 64 + 128, 0)
    assert on["largest_adapted"] == 128 * 64 and on["trainable_params"] == off["trainable_params"]


def test_a_form_the_plan_cannot_count_is_refused_not_skipped():
    """``check_job`` skips the plan of an architecture it cannot build (a warning), but a bad ``reconstruct.form`` is
    the user's to fix: its one-line error goes through."""
    job = load_job(compose_train(["model=llama7b", "reconstruct=blockwise", "reconstruct.form=no_such_form",
                                  "trainer.accelerator=gpu", "trainer.device_memory_gib=80",
                                  "trainer.host_memory_gib=4096"]))
    with pytest.raises(UserError, match="reconstruct.form='no_such_form' is not an adapter method"):
        check_job(job, model_arch(job.model))
