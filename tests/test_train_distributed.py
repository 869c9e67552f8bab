"""Sharded and data-parallel training on CPU processes (gloo): FSDP2 and DDP with 2 ranks, in the default suite.

Each run trains the same global batch as a single-process reference and must end with the same adapter; the
zeros are audited during training, and the merged model reloads with ``AutoModelForCausalLM``. The DDP run also
makes pruning (on every rank, in the setup callback) and the final evaluation (rank 0 alone, after the process
group is closed) slower than the process-group timeout: no rank waits on a collective while another works, so it
still succeeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import compose_train
from transformers import AutoModelForCausalLM

from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from spp.training.config import load_job
from train import run_job

# Every example is cut to exactly 48 byte-tokens (the Alpaca template alone is longer), so the mean loss of the
# global batch equals the mean of the per-rank means and 2 ranks x 2 examples == 1 process x 4 examples.
COMMON = ["model=tiny", "debug=fast", "pruner=wanda", "sparsity=nm2_4", "eval=none", "dense_ppl=false",
          "pruned_ppl=false", "adapter.dropout=0.0", "data.max_length=48", "trainer.max_steps=4",
          "trainer.lr=0.05", "trainer.checkpoint_every_n_steps=2", f"data_dir={SAMPLE_DATA_DIR}"]
SLOW_S, TIMEOUT_S = 50, 40  # the timeout must still cover the other rank's start-up (the rendezvous)

SITECUSTOMIZE = f"""
import os, time
import spp.pruning.cache as cache
import spp.eval.replicas as replicas

_prune, _ppl = cache.prune_offloaded, replicas.replica_perplexity

def slow_prune(*args, **kwargs):
    time.sleep({SLOW_S})
    return _prune(*args, **kwargs)

def slow_ppl(*args, **kwargs):  # rank 0's share of the final perplexity is slow; rank 1 waits for it
    if int(os.environ.get("RANK", "0")) == 0:
        time.sleep({SLOW_S})
    return _ppl(*args, **kwargs)

if os.environ.get("SPP_TEST_SLOW"):
    cache.prune_offloaded, replicas.replica_perplexity = slow_prune, slow_ppl
"""


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, 4 examples per step: the reference adapter."""
    tmp = tmp_path_factory.mktemp("single")
    run_job(load_job(compose_train([*COMMON, "data.train_batch_size=4", f"run_dir={tmp / 'run'}",
                                    f"cache_dir={tmp / 'cache'}"])))
    return load_file(tmp / "run" / "adapter" / "adapter_model.safetensors")


def _train_2_ranks(tmp: Path, strategy: str, *extra: str, env: dict[str, str] | None = None,
                   torchrun: bool = False) -> dict:
    run = tmp / (strategy + ("-torchrun" if torchrun else ""))
    common = [a for a in COMMON if not a.startswith("adapter.dropout") or "adapter=masked_full" not in extra]
    args = [*common, f"strategy={strategy}", "trainer.accelerator=cpu", "trainer.devices=2",
            "data.train_batch_size=2", f"run_dir={run}", f"cache_dir={tmp / 'cache'}", *extra]
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if torchrun else []
    proc = subprocess.run([sys.executable, *launcher, "train.py", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((run / "summary.json").read_text())


def _check(summary: dict, reference: dict[str, torch.Tensor]) -> None:
    run = Path(summary["run"]["run_dir"])
    assert summary["losses"]["optimizer_steps"] == 4
    whens = [a["when"] for a in summary["sparsity"]["audits"]]
    assert whens[0] == "fit_start" and "checkpoint@step2" in whens and whens[-1] == "merged", whens
    assert summary["sparsity"]["before"] == summary["sparsity"]["after"] == 0.5
    adapter = load_file(run / "adapter" / "adapter_model.safetensors")
    assert adapter.keys() == reference.keys()
    for key, value in reference.items():  # gradients summed in another order: float noise, judged per matrix
        gap = float((adapter[key] - value).norm() / value.norm())
        assert gap < 1e-4 and float((adapter[key] - value).abs().max()) < 1e-4, (key, gap)  # measured ≤ 7.3e-6
    assert any(bool((v != 0).any()) for k, v in adapter.items() if k.endswith("spp_beta"))  # it did train
    merged = AutoModelForCausalLM.from_pretrained(run / "merged")
    for name, param in merged.named_parameters():
        if name.endswith("_proj.weight"):
            groups = (param != 0).reshape(param.shape[0], -1, 4).sum(-1)
            assert int(groups.max()) <= 2, name  # 2:4 kept through sharded training and merge


@pytest.mark.slow  # Lightning's launcher (36 s loaded); FSDP2 via torchrun stays in the default suite; CI runs it
def test_fsdp2_on_two_cpu_processes_matches_one_process(single, tmp_path):
    _check(_train_2_ranks(tmp_path, "fsdp"), single)


def test_fsdp2_on_two_processes_started_by_torchrun_matches_one_process(single, tmp_path):
    """As ``srun``/``torchrun`` start a job: both ranks run ``train.py`` from the start (no Lightning launcher),
    prune together in the setup callback and train; the adapter is the single process's."""
    summary = _train_2_ranks(tmp_path, "fsdp", torchrun=True)
    assert summary["pruning"]["cache_hit"] is False
    _check(summary, single)


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_masked_full_keeps_every_zero_under_fsdp2(tmp_path):
    """FSDP2 writes sharded gradients past the weight's tensor hook; the module masks them before each step."""
    summary = _train_2_ranks(tmp_path, "fsdp", "adapter=masked_full")
    whens = [a["when"] for a in summary["sparsity"]["audits"]]
    assert whens[0] == "fit_start" and "checkpoint@step2" in whens and whens[-1] == "merged", whens
    assert summary["sparsity"]["before"] == summary["sparsity"]["after"] == 0.5


@pytest.mark.slow  # sleeps 2 x 50 s by design (pruning and evaluation longer than the timeout); CI runs it
def test_ddp_with_pruning_and_evaluation_slower_than_the_process_group_timeout(single, tmp_path):
    """Pruning (cache miss, every rank) and rank 0's share of the final perplexity each sleep longer than
    ``strategy.timeout_s``: rank 1 waits for rank 0 on the evaluation replicas' own group, not the training one."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    path = os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")])
    summary = _train_2_ranks(tmp_path, "ddp", f"strategy.timeout_s={TIMEOUT_S}", "eval=default", "eval.seqlen=128",
                             "eval.max_windows=2", env={"PYTHONPATH": path, "SPP_TEST_SLOW": "1"})
    assert summary["pruning"]["cache_hit"] is False
    assert summary["timings"]["prune_or_load"] >= SLOW_S > TIMEOUT_S
    assert summary["perplexity"]["merged"] is not None  # measured by both ranks, rank 0 slowly
    assert summary["timings"]["total"] >= 2 * SLOW_S
    _check(summary, single)


@pytest.mark.slow  # two subprocess runs per family (the default suite stays under 10 minutes); CI runs it
@pytest.mark.parametrize("family", ["gemma2", "gpt2"])
def test_fsdp2_on_other_families_matches_one_process(family, tmp_path):
    """Gemma-2 (tied embeddings, blocks found from the model: ``decoder_layer_cls=auto``) and GPT-2 (``Conv1D``
    held as ``nn.Linear``; sharded from rank 0 in memory's layout) train under FSDP2 on 2 processes started by
    torchrun to the one-process adapter."""
    common = [f"model=tiny_{family}" if a == "model=tiny" else a for a in COMMON]
    run_job(load_job(compose_train([*common, "data.train_batch_size=4", f"run_dir={tmp_path / 'one'}",
                                    f"cache_dir={tmp_path / 'cache'}"])))
    reference = load_file(tmp_path / "one" / "adapter" / "adapter_model.safetensors")
    run = tmp_path / "two"
    args = [*common, "strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", "data.train_batch_size=2",
            f"run_dir={run}", f"cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "train.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sparsity"]["before"] == summary["sparsity"]["after"] == 0.5
    adapter = load_file(run / "adapter" / "adapter_model.safetensors")
    assert adapter.keys() == reference.keys() and len(adapter) == 2 * 2 * (7 if family == "gemma2" else 4)
    for key, value in reference.items():  # gradients summed in another order: float noise, judged per matrix
        gap = float((adapter[key] - value).norm() / value.norm())
        assert gap < 1e-4 and float((adapter[key] - value).abs().max()) < 1e-4, (key, gap)  # measured ≤ 7.3e-6
    merged = AutoModelForCausalLM.from_pretrained(run / "merged")
    assert type(merged).__name__ == ("Gemma2ForCausalLM" if family == "gemma2" else "GPT2LMHeadModel")
