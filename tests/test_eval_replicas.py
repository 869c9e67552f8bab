"""Evaluation over replicas: perplexity and lm-eval split data-parallel over processes that each hold
the whole model, on 2 gloo CPU processes started as ``torchrun`` starts them, against one process.

Perplexity: batch ``b`` on replica ``b % R``, the same windows and numbers. lm-eval: document ``i`` on replica
``i % R`` through :class:`~spp.eval.distributed_lm.DistributedHFLM`; every request's log-likelihood is computed
alone (``batch_size=1``), so the per-document records and the metrics are the same bits as one process; an odd
number of documents is padded by lm-eval without counting a document twice. The replica layout arithmetic (leaders,
GPUs of a replica for ``device_map``, the smallest replica that fits) is checked for GPU nodes that are not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spp.distributed import DistContext
from spp.errors import UserError
from spp.eval.harness import evaluate_tasks
from spp.eval.perplexity import load_eval_text, perplexity
from spp.eval.replicas import (
    ReplicaGroup,
    ReplicaLayout,
    replica_devices,
    replica_perplexity,
)
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR

PPL = {"seqlen": 64, "max_windows": 9, "batch_size": 2, "sampling": "systematic"}  # 5 batches: uneven over 2
TEXT_CHARS = 40_000  # the head of the shipped WikiText-2 test split (tokenizing all of it takes seconds)
TASKS = ["spp_boolq", "spp_arc_easy", "spp_mmlu_abstract_algebra"]  # MMLU 5-shot (first_n: the same examples)
LIMIT = 11  # odd: one replica gets a document more, lm-eval pads the other
GIB = 2**30

DRIVER = f"""
import json, sys, torch, torch.distributed as dist
from datetime import timedelta
from transformers import AutoModelForCausalLM
from spp.distributed import DistContext
from spp.eval.distributed_lm import DistributedHFLM
from spp.eval.harness import evaluate_tasks
from spp.eval.replicas import ReplicaGroup, replica_perplexity
from spp.models.tiny import tiny_tokenizer
from spp.paths import SAMPLE_DATA_DIR

requests = []  # how many log-likelihoods this replica computed
scored = DistributedHFLM.loglikelihood
DistributedHFLM.loglikelihood = lambda self, reqs, *a, **k: requests.append(len(reqs)) or scored(self, reqs, *a, **k)

torch.set_num_threads(1)
model_dir, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
ctx = DistContext.current("cpu")
tok = tiny_tokenizer()
result = {{}}

replicas = ReplicaGroup.create(ctx, gpus_per_replica=1, timeout_s=300)
model = AutoModelForCausalLM.from_pretrained(model_dir)
result["ppl"] = replica_perplexity(model, tok, replicas, source=sys.argv[3], **{PPL!r}).to_dict()
res = evaluate_tasks(model_dir, None, {TASKS!r}, limit={LIMIT}, data_dir=SAMPLE_DATA_DIR, log_samples=True,
                     replicas=replicas)
result["harness"] = {{"metrics": res.metrics, "samples": res.raw["samples"], "placement": res.raw["placement"],
                     "requests": sum(requests)}}

# one replica of 2 processes: rank 0 evaluates alone, rank 1 holds nothing and waits for the result
one = ReplicaGroup.create(ctx, gpus_per_replica=2, timeout_s=300)
ppl = replica_perplexity(model, tok, one, source=sys.argv[3], **{PPL!r}).to_dict() if one.is_leader else None
result["shared_ppl"] = one.share(ppl)
result["one_replica"] = {{"leader": one.is_leader, "count": one.count, "how": one.placement()["how"]}}
with open(f"{{out}}.rank{{ctx.rank}}.json", "w") as fh:
    json.dump(result, fh, default=str)
dist.destroy_process_group()
"""


def torchrun(script: Path, nproc: int, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Start ``nproc`` processes together as ``torchrun`` does (no Lightning launcher)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(script),
           *args]
    path = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])  # the script is in a temporary folder
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": path}
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    """A perplexity source: the first rows of the shipped WikiText-2 test split, joined as the protocol joins them."""
    path = tmp_path_factory.mktemp("text") / "wikitext2_head.txt"
    path.write_text(load_eval_text("wikitext2", SAMPLE_DATA_DIR)[0][:TEXT_CHARS], encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny random LLaMA saved once, so every process loads the same weights from the directory."""
    path = tmp_path_factory.mktemp("replicas") / "tiny"
    tiny_llama(seed=0).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def two_replicas(model_dir, text, tmp_path_factory) -> list[dict]:
    """The driver's results on both ranks of a 2-process run."""
    tmp = tmp_path_factory.mktemp("run")
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    proc = torchrun(script, 2, str(model_dir), str(tmp / "out"), text)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads((tmp / f"out.rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def one_process(model_dir, text):
    """The same evaluation in this process, with the plain (single-process) code paths."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ppl = perplexity(model, tiny_tokenizer(), source=text, **PPL)
    res = evaluate_tasks(str(model_dir), None, TASKS, limit=LIMIT, data_dir=SAMPLE_DATA_DIR, log_samples=True)
    return ppl, res


def _records(samples: dict[str, list[dict]]) -> dict[str, dict[int, list]]:
    """``{task: {doc_id: [log-likelihood of each choice]}}`` of lm-eval's logged samples (JSON round trip)."""
    out: dict[str, dict[int, list]] = {}
    for task, rows in samples.items():
        doc_ids = [int(r["doc_id"]) for r in rows]
        assert len(doc_ids) == len(set(doc_ids)), f"{task}: a document was logged twice"
        out[task] = {int(r["doc_id"]): [float(resp[0][0]) for resp in r["resps"]] for r in rows}
    return out


@pytest.mark.slow  # two processes (22 s, shared); the replica layout is tested in-process below; CI runs it
def test_perplexity_over_two_replicas_equals_one_process(two_replicas, one_process):
    ref = one_process[0]
    for rank in range(2):
        got = two_replicas[rank]["ppl"]
        assert got["windows"] == ref.windows == PPL["max_windows"] and got["window_starts"] == ref.window_starts
        for a, b in zip(got["window_nll"], ref.window_nll, strict=True):
            assert abs(a / b - 1) < 1e-6
        assert abs(got["ppl"] / ref.ppl - 1) < 1e-6
    shared = two_replicas[1]["shared_ppl"]  # the non-leader of a 2-GPU replica gets the leader's result
    assert shared == two_replicas[0]["shared_ppl"] and abs(shared["ppl"] / ref.ppl - 1) < 1e-6
    assert two_replicas[0]["one_replica"] == {"leader": True, "count": 1, "how": "parallelize"}
    assert two_replicas[1]["one_replica"] == {"leader": False, "count": 1, "how": "parallelize"}


@pytest.mark.slow  # shares the two-process fixture above
def test_lm_eval_over_two_replicas_gives_the_one_process_metrics(two_replicas, one_process):
    ref = one_process[1]
    for rank in range(2):  # every leader returns replica 0's result
        got = two_replicas[rank]["harness"]
        assert set(got["metrics"]) == set(ref.metrics)
        for task, row in ref.metrics.items():
            for key in ("acc", "acc_norm", "n"):
                assert got["metrics"][task].get(key) == row.get(key), (task, key)
            for key in ("acc_stderr", "acc_norm_stderr"):
                if key in row:
                    assert got["metrics"][task][key] == pytest.approx(row[key], rel=1e-12, abs=1e-15)
    assert {t: r["n"] for t, r in ref.metrics.items()} == {"spp_boolq": LIMIT, "spp_arc_easy": LIMIT,
                                                            "spp_mmlu_abstract_algebra": 10}
    placement = two_replicas[0]["harness"]["placement"]
    assert placement["replicas"] == 2 and placement["how"] == "data_parallel"
    assert placement["lm_eval_model_args"]["pretrained"].endswith("tiny")


@pytest.mark.slow  # shares the two-process fixture above
def test_logged_samples_of_both_replicas_come_back_in_full(two_replicas, one_process):
    samples = one_process[1].raw["samples"]
    # replica r computed the documents i % 2 == r, padded by lm-eval to the larger share of every task
    share = {t: [sum(len(d["arguments"]) for d in rows if d["doc_id"] % 2 == r) for r in range(2)]
             for t, rows in samples.items()}
    assert all(min(n) > 0 for n in share.values()) and any(n[0] != n[1] for n in share.values())
    assert [two_replicas[r]["harness"]["requests"] for r in range(2)] == [sum(max(n) for n in share.values())] * 2
    ref = _records(samples)
    got = _records(two_replicas[0]["harness"]["samples"])
    assert set(got) == set(ref)
    for task in ref:  # every document once, each with the one-process log-likelihoods, bit for bit
        assert sorted(got[task]) == sorted(ref[task]) == list(range(len(ref[task])))
        assert got[task] == ref[task], task


def test_one_process_group_is_a_single_replica(tiny_tok, text):
    model = tiny_llama(seed=0)
    replicas = ReplicaGroup.create(DistContext())
    assert (replicas.index, replicas.count, replicas.is_leader, replicas.group) == (0, 1, True, None)
    assert replicas.mine(3) == [0, 1, 2] and replicas.share({"a": 1}) == {"a": 1}
    got = replica_perplexity(model, tiny_tok, replicas, source=text, **PPL)
    ref = perplexity(model, tiny_tok, source=text, **PPL)
    assert got.window_nll == ref.window_nll and got.ppl == ref.ppl
    assert replicas.placement({"batch_size": 1}) == {
        "replicas": 1, "gpus_per_replica": 1, "how": "single", "world": 1, "lm_eval_model_args": {"batch_size": 1}}


def test_replica_layout_on_two_nodes_of_eight_gpus():
    layouts = [ReplicaLayout(rank, 16, 8, 2) for rank in range(16)]
    assert layouts[0].leaders == [0, 2, 4, 6, 8, 10, 12, 14] and layouts[0].count == 8
    assert [lay.index for lay in layouts] == [r // 2 for r in range(16)]
    assert [lay.is_leader for lay in layouts[:4]] == [True, False, True, False]
    assert [lay.leader for lay in layouts[9:13]] == [8, 10, 10, 12] and layouts[11].local_gpus == [2, 3]
    four = ReplicaLayout(13, 16, 8, 4)
    assert (four.index, four.leader, four.local_gpus, four.count) == (3, 12, [4, 5, 6, 7], 4)
    assert [ReplicaLayout(r, 16, 8, 4).leader for r in range(11, 16)] == [8, 12, 12, 12, 12]  # 12..15: one replica
    assert ReplicaLayout(5, 8, 8, 8).local_gpus == list(range(8)) and ReplicaLayout(5, 8, 8, 8).leaders == [0]
    assert replica_devices(ReplicaLayout(9, 16, 8, 2), device_count=8) == [0, 1]
    assert replica_devices(ReplicaLayout(9, 16, 8, 2), device_count=0) == []
    assert replica_devices(ReplicaLayout(9, 16, 8, 1), device_count=8) == [1]
    assert replica_devices(ReplicaLayout(9, 16, 8, 1), device_count=1) == [0]  # srun --gpus-per-task=1
    with pytest.raises(UserError, match="sees 1"):  # srun --gpus-per-task=1: a task cannot reach its replica's GPUs
        replica_devices(ReplicaLayout(2, 8, 8, 4), device_count=1)
    with pytest.raises(UserError, match="does not divide"):
        ReplicaLayout(0, 8, 8, 3)
    with pytest.raises(UserError, match=">= 1"):
        ReplicaLayout(0, 8, 8, 0)
    how = [ReplicaLayout(0, w, w, k).placement()["how"] for w, k in ((1, 1), (8, 1), (2, 2), (8, 2))]
    assert how == ["single", "data_parallel", "parallelize", "data_parallel+parallelize"]


def test_the_replicas_of_a_saved_folder_are_the_plans(tmp_path):
    """``evaluate`` places a folder as the run plan does (``placement_of_folder``): one GPU per replica when the
    weights and the evaluation batch fit, else the fewest GPUs that hold them, else refused (``cpu``)."""
    from spp.models.tiny import tiny_llama
    from spp.planning.folder import placement_of_folder

    tiny_llama(seed=0).save_pretrained(tmp_path / "m")
    roomy = placement_of_folder(tmp_path / "m", 64, 1, 1, 80 * GIB, 8, 2)
    assert (roomy.replicas, roomy.gpus_per_replica, roomy.how) == (16, 1, "data_parallel")
    weights = sum(f.stat().st_size for f in (tmp_path / "m").glob("*.safetensors"))
    nothing = placement_of_folder(tmp_path / "m", 64, 1, 1, weights // 100, 2, 1)  # (the split itself: test_plan)
    assert nothing.how == "cpu"


def test_an_in_memory_model_on_a_single_replica_scores_as_plain_lm_eval(tiny_tok, sample_data_dir):
    model = tiny_llama(seed=0)
    args = {"tasks": ["spp_boolq"], "limit": 3, "data_dir": sample_data_dir, "log_samples": True}
    got = evaluate_tasks(model, tiny_tok, replicas=ReplicaGroup.create(DistContext()), **args)
    ref = evaluate_tasks(model, tiny_tok, **args)
    assert got.metrics == ref.metrics and _records(got.raw["samples"]) == _records(ref.raw["samples"])
    assert got.raw["placement"] == {"replicas": 1, "gpus_per_replica": 1, "how": "single", "world": 1,
                                    "lm_eval_model_args": {"pretrained": "<in-memory model>", "device": "cpu",
                                                           "batch_size": 1}}
    assert "placement" not in ref.raw


def test_one_process_loads_the_folder_on_the_gpu_eval_device_names(monkeypatch, tmp_path):
    """``eval.device=cuda:1`` on one process: the folder is loaded on cuda:1, the GPU whose memory placed it, not on
    cuda:0; processes of a torchrun job keep their local rank's GPU whatever the device names."""
    import torch

    import spp.eval.evaluate as evaluate_module
    from spp.eval.config import EvalConfig

    loaded = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    def load_replica_model(path, gpus, device, max_memory_per_gpu):
        loaded.append(gpus)
        return torch.nn.Linear(1, 1), {}

    monkeypatch.setattr(evaluate_module, "load_replica_model", load_replica_model)
    for ctx_device, eval_device in ((torch.device("cuda", 0), "cuda:1"), (torch.device("cuda", 1), None)):
        replicas = ReplicaGroup.create(DistContext(device=ctx_device))
        evaluate_module._load(tmp_path, EvalConfig(device=eval_device), replicas, tokenizer="tokenizer")
    assert loaded == [[1], [1]]
    assert replica_devices(ReplicaLayout(9, 16, 8, 1), device_count=8, device=torch.device("cuda", 5)) == [1]
