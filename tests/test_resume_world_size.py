"""A resume on another world size or strategy is refused in one line, in the preflight, before any weight loads.

A checkpoint's data position (batches of this rank's ``DistributedSampler`` shard), its random states (one per
rank) and its optimiser state (DDP replica, FSDP2 shards) do not map to another world size or strategy, so
``spp.training.resume_checks.check_world`` compares the ``world`` record of ``spp_settings`` (an older checkpoint:
the count of its per-rank random states) with the job. Real checkpoints: one written by one process, one by two
DDP processes and one by two FSDP2 processes (gloo on CPU, started by torchrun; ~12 s each).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import compose_train

from spp.errors import UserError
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from spp.training.callbacks.rng_state import RngState
from spp.training.config import load_job
from spp.training.resume_checks import check_resume, settings_of
from train import run_job

COMMON = ["model=tiny", "debug=fast", "pruner=wanda", "sparsity=nm2_4", "eval=none", "dense_ppl=false",
          "pruned_ppl=false", "adapter.dropout=0.05", "data.max_length=48", "trainer.max_steps=2",
          "trainer.lr=0.05", "trainer.checkpoint_every_n_steps=2", "trainer.save_top_k=-1",
          "guards.loss_must_fall=false", "sample.enabled=false", "export.merged=false", f"data_dir={SAMPLE_DATA_DIR}"]
TWO = ["trainer.accelerator=cpu", "trainer.devices=2", "data.train_batch_size=2"]
ONE = ["data.train_batch_size=4"]
VALIDATE_EVERY_2 = "trainer.val_check_interval=2"


def _job(tmp: Path, run: str, *extra: str):
    return load_job(compose_train([*COMMON, f"run_dir={tmp / run}", f"cache_dir={tmp / 'cache'}", *extra]))


def _checkpoint(run: Path, step: int = 2) -> Path:
    found = run / "checkpoints" / f"adapter-step{step:06d}.ckpt"
    assert found.is_file(), list((run / "checkpoints").iterdir()) if (run / "checkpoints").exists() else run
    return found


def _train_two(tmp: Path, strategy: str, *extra: str, run: str | None = None) -> Path:
    """Two processes (torchrun, gloo) train with ``strategy``; the run directory."""
    run_dir = tmp / (run or strategy)
    args = [*COMMON, f"strategy={strategy}", *TWO, f"run_dir={run_dir}", f"cache_dir={tmp / 'cache'}", *extra]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "train.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return run_dir


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[Path, Path]:
    """``(tmp, checkpoint)`` of a one-process run (strategy auto: ``single``)."""
    tmp = tmp_path_factory.mktemp("one")
    run_job(_job(tmp, "one", *ONE))
    return tmp, _checkpoint(tmp / "one")


@pytest.fixture(scope="module")
def two_ddp(tmp_path_factory) -> tuple[Path, Path]:
    """``(tmp, step-2 checkpoint)`` of two DDP processes trained 4 steps uninterrupted (adapter in ``tmp/ddp``),
    validating after steps 2 and 4 (the step-2 checkpoint is written before its validation)."""
    tmp = tmp_path_factory.mktemp("two")
    return tmp, _checkpoint(_train_two(tmp, "ddp", "trainer.max_steps=4", VALIDATE_EVERY_2))


def _refused_in_preflight(job, *expected: str) -> str:
    """Run ``job`` (a resume); it must stop with one line in ``preflight_train``, naming ``expected``."""
    with pytest.raises(UserError) as err:
        run_job(job)
    message = str(err.value)
    assert "\n" not in message and all(e in message for e in expected), message
    frames = [f.name for f in traceback.extract_tb(err.value.__traceback__)]
    assert "preflight_train" in frames and "_run_locked" not in frames, frames  # before the lock, prune and load
    return message


def test_one_process_checkpoint_records_its_world(one_process):
    saved = torch.load(one_process[1], map_location="cpu", weights_only=False)
    assert saved["spp_settings"]["world"] == {"devices": 1, "num_nodes": 1, "world_size": 1, "strategy": "single"}
    assert len(saved["rng_states"]) == 1


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_to_two_processes_is_refused_in_one_line(one_process, strategy):
    tmp, ckpt = one_process
    job = _job(tmp, "one", f"strategy={strategy}", *TWO, f"trainer.resume_from={ckpt}")
    message = _refused_in_preflight(job, "trainer.devices=1 trainer.num_nodes=1 strategy=single (1 process(es))",
                                    f"trainer.devices=2 trainer.num_nodes=1 strategy={strategy} (2 process(es))")
    assert message.startswith(f"trainer.resume_from={str(ckpt)!r} was written with"), message


def test_same_world_other_strategy_is_refused_and_same_world_passes(one_process):
    tmp, ckpt = one_process
    check_resume(_job(tmp, "one", *ONE), ckpt)  # negative control: the same world and settings pass the preflight
    with pytest.raises(UserError, match="strategy=single .*strategy=ddp") as err:
        check_resume(_job(tmp, "one", *ONE, "strategy=ddp", "trainer.accelerator=cpu"), ckpt)
    assert err.value.key == "strategy"


def test_two_ddp_processes_to_one_is_refused_in_one_line(two_ddp):
    tmp, ckpt = two_ddp
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert saved["spp_settings"]["world"] == {"devices": 2, "num_nodes": 1, "world_size": 2, "strategy": "ddp"}
    assert len(saved["rng_states"]) == 2
    check_resume(_job(tmp, "ddp", "strategy=ddp", *TWO), ckpt)  # negative control: 2 -> 2 DDP passes
    _refused_in_preflight(_job(tmp, "ddp", *ONE, f"trainer.resume_from={ckpt}"),
                          "trainer.devices=2 trainer.num_nodes=1 strategy=ddp (2 process(es))",
                          "trainer.devices=1 trainer.num_nodes=1 strategy=single (1 process(es))")


def test_two_ddp_processes_to_two_resume_exactly(two_ddp):
    """The accepted case: 2 -> 2 DDP processes, resumed from step 2 in another run directory, end with the adapter
    of the uninterrupted 4-step run bit for bit (dropout 0.05: the per-rank random states and data positions), and
    with its two validation losses (the one due after step 2 runs first on resume, on both ranks)."""
    tmp, ckpt = two_ddp
    resumed = _train_two(tmp, "ddp", "trainer.max_steps=4", VALIDATE_EVERY_2, f"trainer.resume_from={ckpt}",
                         run="resumed")
    reference = load_file(tmp / "ddp" / "adapter" / "adapter_model.safetensors")
    adapter = load_file(resumed / "adapter" / "adapter_model.safetensors")
    assert adapter.keys() == reference.keys() and len(reference) > 0
    losses = [json.loads((run / "summary.json").read_text())["losses"] for run in (tmp / "ddp", resumed)]
    assert len(losses[0]["train"]) == 4 and losses[1]["train"] == losses[0]["train"], losses  # steps 1-2's travel
    assert len(losses[0]["val"]) == 2 and losses[1]["val"] == losses[0]["val"], losses
    with (resumed / "csv" / "metrics.csv").open() as f:  # it resumed: this run logged steps 3 and 4 only
        assert sorted(int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")) == [2, 3]
    assert any(bool((v != 0).any()) for k, v in reference.items() if k.endswith("spp_beta"))  # it did train
    for key, value in reference.items():
        assert torch.equal(adapter[key], value), (key, float((adapter[key] - value).abs().max()))


def test_older_checkpoint_without_the_record_is_judged_by_its_random_states(two_ddp, tmp_path, caplog):
    """A checkpoint written before the world was recorded: its per-rank random states give its world size (none:
    not compared, a warning says so)."""
    tmp, ckpt = two_ddp
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    del saved["spp_settings"]["world"]
    old = tmp_path / "old.ckpt"
    torch.save(saved, old)
    with caplog.at_level("WARNING"):
        check_resume(_job(tmp, "ddp", "strategy=ddp", *TWO), old)  # 2 -> 2 passes (the strategy is not known)
    assert "random states give 2 process(es), the strategy is not compared" in caplog.text
    del saved["rng_states"]
    torch.save(saved, older := tmp_path / "older.ckpt")
    caplog.clear()
    with caplog.at_level("WARNING"):
        check_resume(_job(tmp, "ddp", "data.train_batch_size=2"), older)  # 1 process: accepted as before, warned
    assert "predates the record of trainer.devices, trainer.num_nodes and strategy; not compared" in caplog.text
    with pytest.raises(UserError, match=r"did not record .*\(2 process\(es\)\).*strategy=single \(1 process") as err:
        check_resume(_job(tmp, "ddp", *ONE), old)
    assert err.value.key == "trainer.devices"


def test_random_states_of_another_world_size_are_refused_at_load():
    """The callback's own guard (after the preflight): 2 saved states, 1 process."""
    from spp.training.callbacks.rng_state import rng_states

    trainer = SimpleNamespace(world_size=1, global_rank=0)
    with pytest.raises(UserError, match="random states of 2 process"):
        RngState().on_load_checkpoint(trainer, None, {"rng_states": [rng_states(), rng_states()]})  # type: ignore
    callback = RngState()
    callback.on_load_checkpoint(trainer, None, {"rng_states": [rng_states()]})  # type: ignore
    assert callback._pending is not None


def test_two_fsdp2_processes_to_one_is_refused_in_one_line(tmp_path):
    ckpt = _checkpoint(_train_two(tmp_path, "fsdp"))
    assert settings_of(_job(tmp_path, "fsdp", "strategy=fsdp", *TWO))["world"]["strategy"] == "fsdp"
    check_resume(_job(tmp_path, "fsdp", "strategy=fsdp", *TWO), ckpt)  # negative control: 2 -> 2 FSDP2 passes
    _refused_in_preflight(_job(tmp_path, "fsdp", *ONE, "strategy=fsdp", f"trainer.resume_from={ckpt}"),
                          "trainer.devices=2 trainer.num_nodes=1 strategy=fsdp (2 process(es))",
                          "trainer.devices=1 trainer.num_nodes=1 strategy=fsdp (1 process(es))")
