"""The trained model is gone before evaluation starts, and the plan's evaluate phase counts what stays.

On 2 processes (DDP and FSDP2, gloo on CPU), no storage of the trained parameters (FSDP2's local shards
included), their gradients, AdamW's state, the teacher or the pruned weights rank 0 kept is alive when
``evaluate()`` is entered.

A probe (``sitecustomize``, imported by every process before ``train.py``) wraps four functions of the real job:

- ``spp.training.phases.gather_trainable`` (called once training is over, with the strategy and the trained
  model): weak references to every such storage (``untyped_storage()``: one Python object per storage, alive as
  long as any tensor, view or C++ holder uses it) and to the strategy, the LightningModule, the wrapper (DDP) and
  the optimizers;
- ``spp.commands.train.fit``: the same for the pruned weights rank 0 kept for the adapter files (``pruned.home``);
- ``spp.training.module.place_teacher``: the same for the dense teacher of ``objective=distill``, once placed;
- ``spp.training.finalize.evaluate``: at its start, after ``gc.collect()``, which of them are still alive, and
  every live ``torch.Tensor`` that ``gc.get_objects()`` finds sharing one of those storages (``data_ptr``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from train_helpers import compose_train

from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from spp.planning.job import plan_output
from spp.preflight.model_files import model_arch
from spp.training.config import load_job

PROBE = r'''
import gc, json, os, weakref
import torch

if os.environ.get("SPP_RELEASE_PROBE"):
    import spp.commands.train as train_cmd
    import spp.training.finalize as finalize
    import spp.training.module as module
    import spp.training.phases as phases
    from torch.distributed.tensor import DTensor

    _storages = {}   # data_ptr -> (weakref to the storage, what it held)
    _objects = {}    # name -> weakref
    _gather, _fit, _evaluate = phases.gather_trainable, train_cmd.fit, finalize.evaluate
    _place_teacher = module.place_teacher

    def _local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    def _keep(t, what):
        t = _local(t)
        if not isinstance(t, torch.Tensor) or t.is_meta:
            return
        storage = t.untyped_storage()
        if storage.nbytes():
            _storages[storage.data_ptr()] = (weakref.ref(storage), what)

    def gather(strategy, model):
        for name, p in model.named_parameters():
            _keep(p, "parameter " + name)
            if p.grad is not None:
                _keep(p.grad, "gradient " + name)
            if getattr(p, "ds_tensor", None) is not None:  # DeepSpeed ZeRO-3's partition
                _keep(p.ds_tensor, "partition " + name)
        for i, opt in enumerate(strategy.optimizers):
            _objects[f"optimizer{i}"] = weakref.ref(opt)
            for state in opt.state.values():
                for key, value in state.items():
                    _keep(value, "optimizer state " + key)
        _objects.update(strategy=weakref.ref(strategy), lightning_module=weakref.ref(strategy.lightning_module),
                        wrapper=weakref.ref(strategy.model), trained_model=weakref.ref(model))
        return _gather(strategy, model)

    def place_teacher(teacher, *args, **kwargs):
        _place_teacher(teacher, *args, **kwargs)
        _objects["teacher"] = weakref.ref(teacher)
        for name, p in teacher.named_parameters():
            _keep(p, "teacher parameter " + name)

    def fit(*args, **kwargs):
        pruned, fitted = _fit(*args, **kwargs)
        for name, t in pruned.home.items():
            _keep(t, "kept pruned weight " + name)
        return pruned, fitted

    def evaluate(*args, **kwargs):
        gc.collect()
        alive = {ptr: what for ptr, (ref, what) in _storages.items() if ref() is not None}
        holders = []
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and not obj.is_meta:
                    ptr = _local(obj).untyped_storage().data_ptr()
                    if ptr in alive:
                        holders.append(f"{type(obj).__name__}{tuple(obj.shape)} ({alive[ptr]})")
            except Exception:
                pass
        report = {"recorded": len(_storages), "recorded_kinds": sorted({w for _, w in _storages.values()}),
                  "alive": sorted(alive.values()), "holders": holders,
                  "objects_alive": sorted(k for k, ref in _objects.items() if ref() is not None)}
        rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
        out = os.path.join(os.environ["SPP_RELEASE_PROBE"], f"rank{rank}.json")
        with open(out, "w") as f:
            json.dump(report, f)
        return _evaluate(*args, **kwargs)

    phases.gather_trainable, train_cmd.fit, finalize.evaluate = gather, fit, evaluate
    module.place_teacher = place_teacher
'''

ARGS = ["model=tiny", "debug=fast", "pruner=magnitude", "sparsity=nm2_4", "eval=none", "dense_ppl=false",
        "pruned_ppl=false", "data.max_length=48", "trainer.max_steps=2",
        "trainer.limit_val_batches=0", "trainer.accelerator=cpu", "trainer.devices=2", "data.train_batch_size=2",
        f"data_dir={SAMPLE_DATA_DIR}"]


def _probe_run(tmp: Path, strategy: str, *extra: str) -> list[dict]:
    """Train on 2 processes started by torchrun with the probe; each rank's report at the start of evaluate()."""
    hooks, reports = tmp / "hooks", tmp / "reports"
    hooks.mkdir()
    reports.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(PROBE))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPP_RELEASE_PROBE": str(reports),
           "PYTHONPATH": os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")])}
    args = [*ARGS, f"strategy={strategy}", f"run_dir={tmp / 'run'}", f"cache_dir={tmp / 'cache'}", *extra]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "train.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((reports / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize(("strategy", "objective"), [("fsdp", "ce"), ("ddp", "distill")])
def test_no_storage_of_the_trained_model_is_alive_when_evaluation_starts(strategy, objective, tmp_path):
    """Fails on the code before ``release`` dropped ``pruned.model``: 51 storages alive on each FSDP2 rank, 77 on
    each DDP rank (every parameter and its last gradient)."""
    reports = _probe_run(tmp_path, strategy, f"objective={objective}")
    for rank, report in enumerate(reports):
        # the probe saw the trained parameters and AdamW's moments on every rank (a probe that recorded nothing
        # would pass vacuously): the tiny model's 2 blocks x 7 projections, SPP's alpha and beta each
        assert report["recorded"] >= 2 * 7 * 2 * 3, (rank, report["recorded"])
        assert any(w.startswith("optimizer state") for w in report["recorded_kinds"]), rank
        if strategy == "fsdp" and rank == 0:  # the pruned weights kept for the adapter files
            assert any(w.startswith("kept pruned weight") for w in report["recorded_kinds"])
        assert report["alive"] == [] and report["holders"] == [], (rank, report["alive"][:5], report["holders"][:5])
        assert report["objects_alive"] == [], (rank, report["objects_alive"])
    if objective == "distill":  # the teacher was placed and recorded, and is gone too
        assert any(w.startswith("teacher") for r in reports for w in r["recorded_kinds"])


GIB = 2**30


def test_65b_fsdp2_on_8_gpus_evaluates_within_an_h100_with_what_stays_counted():
    """``train.py model=llama65b strategy=fsdp trainer.devices=8 plan=true trainer.device_memory_gib=79.2`` (the
    79.2 GiB an H100 80 GB reports): every phase fits. The evaluate phase counts nothing of training on the GPUs
    (released, test above) and the packed masks rank 0 keeps for the summary on its host: 1 bit per prunable weight
    of 80 blocks x (4 x 8192^2 + 3 x 8192 x 22016) = 8,095,006,720 bytes. Had the 1/8 shards of the 121.6 GiB
    model stayed on every GPU (the code before ``release`` dropped ``pruned.model``), evaluation would not fit."""
    job = load_job(compose_train(["model=llama65b", "strategy=fsdp", "trainer.devices=8", "plan=true",
                                  "trainer.device_memory_gib=79.2"]))
    _, plan = plan_output(job, model_arch(job.model))
    assert plan["problems"] == []
    evaluate = next(p for p in plan["phases"] if p["name"] == "evaluate")
    assert evaluate["rank0"]["masks"] == 80 * (4 * 8192**2 + 3 * 8192 * 22016) // 8 == 8_095_006_720
    assert set(evaluate["device"]) == {"weights", "block", "hidden", "logits", "kv_cache", "cuda_context"}
    assert evaluate["device_bytes"] <= 79.2 * GIB < evaluate["device_bytes"] + plan["weight_bytes"] // 8


def test_the_evaluate_phase_counts_what_deepspeed_keeps_on_every_gpu():
    """DeepSpeed's engine outlives ``release`` (its hooks hold the module; the probe above, run on
    ``tests/test_zero3_deepspeed.py``'s 2 CPU processes, found the module, partitions and optimizer alive under
    ZeRO-2 and ZeRO-3): the evaluate phase of ``llama7b`` on 8 GPUs with ZeRO-3 counts each GPU's 1/8 of the
    weights and its fp32 master and moments (12 bytes per trainable parameter / 8) beside the replica."""
    job = load_job(compose_train(["model=llama7b", "strategy=deepspeed_stage3", "trainer.devices=8", "plan=true"]))
    _, plan = plan_output(job, model_arch(job.model))
    evaluate = next(p for p in plan["phases"] if p["name"] == "evaluate")
    assert evaluate["device"]["deepspeed_weights"] == plan["weight_bytes"] // 8
    assert evaluate["device"]["deepspeed_optimizer"] == 12 * plan["trainable_params"] // 8
