"""Ctrl-C and exact resume, through real ``python train.py experiment=tiny_smoke`` child processes and a real SIGINT.

Run A trains 40 steps uninterrupted; run B gets a SIGINT once a mid-run checkpoint exists, then resumes with
``trainer.resume_from=last``: A's and B's adapters must be bitwise equal with adapter dropout 0.05 (the random
state travels in the checkpoint). With ``trainer.checkpoint_every_n_steps=null`` a Ctrl-C still leaves a
checkpoint, and the resume command the log prints finishes the run.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from safetensors.torch import load_file

from spp.paths import SAMPLE_DATA_DIR

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["experiment=tiny_smoke", "guards.loss_must_fall=false", "trainer.max_steps=40", "trainer.max_epochs=10",
         "adapter.dropout=0.05", "trainer.progress_bar=log", "trainer.progress_every_s=0", "eval=none",
         "dense_ppl=false", "pruned_ppl=false", "sample.enabled=false", "export.merged=false",
         f"data_dir={SAMPLE_DATA_DIR}"]
STEP_LINE = re.compile(r"\bstep (\d+)/(\d+)")


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _start(args: list[str], cwd: Path, output: Path | None = None) -> subprocess.Popen:
    """Start ``python train.py args`` in ``cwd``; its output goes to ``output`` (a file), else to a pipe."""
    out = output.open("w") if output is not None else subprocess.PIPE
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={cwd / 'hydra'}"],
                            cwd=cwd, env=_env(), stdout=out, stderr=subprocess.STDOUT, text=True)


def _train(args: list[str], cwd: Path, interrupt_at: int | None = None,
           wait_for: Path | None = None) -> tuple[int, str]:
    """Run ``python train.py args``; SIGINT it after its progress line for step ``interrupt_at`` once ``wait_for``
    exists. Returns (exit status, output)."""
    proc = _start(args, cwd)
    lines, sent = [], False
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        step = STEP_LINE.search(line)
        if (interrupt_at is not None and not sent and step and int(step.group(1)) >= interrupt_at
                and (wait_for is None or wait_for.exists())):
            proc.send_signal(signal.SIGINT)
            sent = True
    code = proc.wait(timeout=300)
    return code, "".join(lines)


def _adapter(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "adapter" / "adapter_model.safetensors")


def _resume_line(output: str) -> list[str]:
    """The arguments of the ``resume with: python train.py ...`` line the interrupted run logged."""
    found = [line.split("resume with: ", 1)[1] for line in output.splitlines() if "resume with: " in line]
    assert len(found) == 1, output[-3000:]
    words = shlex.split(found[0])
    assert words[:2] == ["python", "train.py"], found[0]
    return words[2:]


@pytest.mark.slow  # three train.py runs (36 s loaded); a real SIGINT stays in the default suite below; CI runs it
def test_sigint_then_resume_gives_the_uninterrupted_adapter(tmp_path):
    """A: 40 steps. B: SIGINT once the step-5 checkpoint exists, then ``trainer.resume_from=last``. Bitwise equal."""
    cache = f"cache_dir={tmp_path / 'cache'}"
    common = [*SMOKE, cache, "trainer.checkpoint_every_n_steps=5", "trainer.save_top_k=-1"]
    run_a = _start([*common, f"run_dir={tmp_path / 'A'}"], tmp_path, tmp_path / "A.log")  # beside B: less wall time
    run_b = tmp_path / "B"
    code, out = _train([*common, f"run_dir={run_b}"], tmp_path, interrupt_at=6,
                       wait_for=run_b / "checkpoints" / "adapter-step000005.ckpt")
    assert code != 0 and not (run_b / "summary.json").exists(), out[-3000:]
    last = (run_b / "checkpoints" / "last.ckpt").resolve()
    stopped_at = int(re.search(r"step(\d+)", last.name).group(1))
    assert 5 <= stopped_at < 40, last
    assert torch.load(last, map_location="cpu", weights_only=False)["rng_states"]
    code, out = _train([*_resume_line(out)], tmp_path)
    assert code == 0, out[-3000:]
    assert run_a.wait(timeout=300) == 0, (tmp_path / "A.log").read_text()[-3000:]
    full, resumed = _adapter(tmp_path / "A"), _adapter(run_b)
    assert full.keys() == resumed.keys() and full
    for key in full:
        assert torch.equal(full[key], resumed[key]), key


def test_sigint_without_periodic_checkpoints_leaves_a_resumable_one(tmp_path):
    """``trainer.checkpoint_every_n_steps=null`` (the default) in a one-epoch run: Ctrl-C at step 3 of 60 writes a
    checkpoint of the step under way, with all a resume needs, and logs the command (the test above runs it)."""
    run = tmp_path / "run"
    args = [*SMOKE, f"cache_dir={tmp_path / 'cache'}", "trainer.max_steps=60", "trainer.max_epochs=1",
            "data.max_examples=400", "trainer.checkpoint_every_n_steps=null", f"run_dir={run}"]
    code, out = _train(args, tmp_path, interrupt_at=3)
    assert code != 0 and not (run / "summary.json").exists(), out[-3000:]
    saved = sorted((run / "checkpoints").glob("adapter-step*.ckpt"))
    assert len(saved) == 1, (saved, out[-3000:])
    step = int(re.search(r"step(\d+)", saved[0].name).group(1))
    assert 3 <= step < 60 and (run / "checkpoints" / "last.ckpt").resolve() == saved[0].resolve()
    assert f"interrupted: training stopped after optimiser step {step}; resumable checkpoint: {saved[0]}" in out
    resume = _resume_line(out)
    assert f"run_dir={run}" in resume and resume[-1] == "trainer.resume_from=last"
    ckpt = torch.load(saved[0], map_location="cpu", weights_only=True)  # as Lightning loads it on resume
    assert ckpt["global_step"] == step and ckpt["state_dict"] and ckpt["optimizer_states"] and ckpt["lr_schedulers"]
    assert ckpt["rng_states"] and ckpt["spp_settings"]
    assert ckpt["AlpacaDataModule"]["batches_done"] == step


def test_resume_command_drops_the_old_run_dir_and_resume(tmp_path, monkeypatch):
    from hydra.core.hydra_config import HydraConfig

    from spp.training.callbacks.adapter_checkpoint import resume_command

    task = ["a=1", "run_dir=/x", "trainer.resume_from=last", "b='c d'"]
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: SimpleNamespace(overrides=SimpleNamespace(task=task))))
    words = shlex.split(resume_command(tmp_path))
    assert words == ["python", "train.py", "a=1", "b='c d'", f"run_dir={tmp_path}", "trainer.resume_from=last"]


class _Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.linear(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _CtrlC(L.Callback):
    """Sends this process ``times`` SIGINTs at the start of micro-batch ``at`` (what a terminal's Ctrl-C does)."""

    def __init__(self, at: int, times: int) -> None:
        self.at, self.times = at, times

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.at:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("times, accumulate, expected", [(1, 1, "adapter-step000005.ckpt"),
                                                         (1, 2, "adapter-step000003.ckpt"), (2, 1, None)])
def test_ctrl_c_in_process(times, accumulate, expected, tmp_path, caplog):
    """One Ctrl-C during micro-batch 4 (0-based, step 5): the optimiser step it belongs to is finished and checkpointed
    (with gradient accumulation 2, micro-batches 4-5 are step 3); a second Ctrl-C stops at once, without one."""
    from torch.utils.data import DataLoader, TensorDataset

    from spp.training.callbacks.adapter_checkpoint import AdapterCheckpoint

    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    checkpoints = AdapterCheckpoint(tmp_path / "checkpoints")
    trainer = L.Trainer(accelerator="cpu", max_steps=30, accumulate_grad_batches=accumulate, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[checkpoints, _CtrlC(at=4, times=times)])
    previous = signal.getsignal(signal.SIGINT)
    try:
        with caplog.at_level("WARNING"), pytest.raises(SystemExit):
            trainer.fit(_Regression(), data)
    finally:
        signal.signal(signal.SIGINT, previous)  # Lightning ignores SIGINT from its shutdown on
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("adapter-step*.ckpt"))
    if expected:
        assert saved == [expected] and "resume with: python train.py" in caplog.text
    else:
        assert saved == [] and "interrupted at once (second Ctrl-C)" in caplog.text


def test_resume_from_an_epoch_end_checkpoint_is_exact(tmp_path):
    """``trainer.checkpoint_every_n_steps=null``: a checkpoint at each epoch end, written after that epoch's
    validation (whose loader draws from the global generator). Resuming from the first one gives the adapter of the
    uninterrupted 3-epoch run, bitwise, with dropout 0.05 (in process: same code path as ``train.py``)."""
    from train_helpers import tiny_job

    from train import run_job

    args = ["experiment=tiny_smoke", "guards.loss_must_fall=false", "trainer.max_steps=-1", "trainer.max_epochs=3",
            "adapter.dropout=0.05", "eval=none", "dense_ppl=false", "pruned_ppl=false", "sample.enabled=false",
            "export.merged=false", "trainer.checkpoint_every_n_steps=null", "trainer.save_top_k=-1",
            f"cache_dir={tmp_path / 'cache'}"]
    full = run_job(tiny_job(tmp_path, *args, run="A"))
    steps = full["losses"]["optimizer_steps"]
    first = sorted((tmp_path / "A" / "checkpoints").glob("adapter-step*.ckpt"))[0]
    assert full["losses"]["val"] and 0 < int(re.search(r"step(\d+)", first.name).group(1)) < steps
    resumed = run_job(tiny_job(tmp_path, *args, f"trainer.resume_from={first}", run="B"))
    assert resumed["losses"]["optimizer_steps"] == steps
    for key in ("train", "val", "train_first", "train_last"):  # the losses before the resume travel in the checkpoint
        assert resumed["losses"][key] == full["losses"][key], key
    a, b = _adapter(tmp_path / "A"), _adapter(tmp_path / "B")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_in_the_same_run_dir_keeps_the_metrics_logged_before_it(tmp_path):
    """Lightning's CSV writer deletes an existing ``metrics.csv`` when it starts; a resume in the interrupted run's
    ``run_dir`` keeps the rows of the steps before it (a fresh run's file is the negative control: steps 0-3 only)."""
    import csv

    from train_helpers import tiny_job

    from train import run_job

    args = ["experiment=tiny_smoke", "guards.loss_must_fall=false", "trainer.max_epochs=10", "eval=none",
            "dense_ppl=false", "pruned_ppl=false", "sample.enabled=false", "export.merged=false",
            "trainer.checkpoint_every_n_steps=2", f"cache_dir={tmp_path / 'cache'}"]
    metrics = tmp_path / "run" / "csv" / "metrics.csv"

    def loss_steps() -> list[int]:
        with metrics.open(newline="") as f:
            return sorted(int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss"))

    run_job(tiny_job(tmp_path, *args, "trainer.max_steps=4"))
    assert loss_steps() == [0, 1, 2, 3]
    run_job(tiny_job(tmp_path, *args, "trainer.max_steps=8", "trainer.resume_from=last"))
    assert loss_steps() == list(range(8))


class _CtrlCAtBatch(L.Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.at:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("at", [
    4,  # control: step 5's checkpoint, no validation due after it
    5,  # step 6's checkpoint, written at on_train_batch_end before the validation due after batch 6: the resume runs it
])
def test_ctrl_c_then_resume_keeps_every_validation(at, tmp_path):
    """Ctrl-C at micro-batch ``at`` (0-based), resume: the adapter and training losses equal the uninterrupted run's,
    and so do the validation losses (``trainer.val_check_interval=3``: after batches 3, 6, ...), logged at the same
    steps."""
    import csv

    def val_rows(run: str) -> list[tuple[int, str]]:
        with (tmp_path / run / "csv" / "metrics.csv").open(newline="") as f:
            return [(int(row["step"]), row["val/loss"]) for row in csv.DictReader(f) if row.get("val/loss")]

    from train_helpers import tiny_job

    from train import run_job

    args = ["experiment=tiny_smoke", "guards.loss_must_fall=false", "trainer.max_steps=14", "trainer.max_epochs=10",
            "adapter.dropout=0.05", "eval=none", "dense_ppl=false", "pruned_ppl=false", "sample.enabled=false",
            "export.merged=false", "trainer.checkpoint_every_n_steps=1", "trainer.val_check_interval=3",
            f"cache_dir={tmp_path / 'cache'}"]
    full = run_job(tiny_job(tmp_path, *args, run="A"))
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises((SystemExit, KeyboardInterrupt)):
            run_job(tiny_job(tmp_path, *args, run="B"), callbacks=[_CtrlCAtBatch(at)])
    finally:
        signal.signal(signal.SIGINT, previous)
    resumed = run_job(tiny_job(tmp_path, *args, "trainer.resume_from=last", run="B"))
    a, b = _adapter(tmp_path / "A"), _adapter(tmp_path / "B")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["losses"]["train"] == full["losses"]["train"]
    assert len(full["losses"]["val"]) == 4 and resumed["losses"]["val"] == full["losses"]["val"]
    assert val_rows("B") == val_rows("A") and len(val_rows("A")) == 4
