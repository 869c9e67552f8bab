"""Progress never goes silent: a piped ``debug=fast`` run logs one line per pruned block and a training
line at least every 30 s; a bar's total is the batches the run really takes (``max_steps``); lm-eval's bars become
log lines outside a terminal; an evaluation stopped during its lm-eval tasks keeps the perplexity it measured."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from datetime import datetime

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch.utils.data import DataLoader, TensorDataset

from spp.eval.progress_lines import LineBar, lm_eval_bars_as_lines
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from spp.training.callbacks.progress import StepBoundedTQDMBar

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]")
BLOCK = re.compile(r"prune magnitude nm2_4: block (\d+)/(\d+) ")
STEP = re.compile(r"step (\d+)/(\d+) ")


def _stamp(line: str) -> datetime | None:
    match = STAMP.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S") if match else None


@pytest.mark.slow  # a whole piped run (≈ 30-70 s on 2 cores); CI's slow step runs it
def test_piped_debug_fast_run_logs_every_block_and_every_30_s_of_training(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "PYTHONPATH": str(REPO_ROOT)}
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train.py", "model=tiny", "debug=fast", "pruner=magnitude",
                           "sparsity=nm2_4", f"data_dir={SAMPLE_DATA_DIR}", f"cache_dir={tmp_path / 'cache'}",
                           f"run_dir={run}", "export.merged=false"],
                          cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=900)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-4000:]
    blocks = [BLOCK.search(line) for line in lines]
    done = sorted(int(m.group(1)) for m in blocks if m)
    total = {int(m.group(2)) for m in blocks if m}
    assert len(total) == 1 and done == list(range(1, total.pop() + 1)), "\n".join(lines[-80:])
    assert any(re.search(r"ppl wikitext2@128: batch: 2/2 in [\d.]+ s", line) for line in lines)  # perplexity
    start = next(i for i, line in enumerate(lines) if "training: " in line and "optimiser steps" in line)
    steps = [(i, STEP.search(line)) for i, line in enumerate(lines) if STEP.search(line)]
    assert steps and steps[-1][1].group(1) == steps[-1][1].group(2) == "6"  # the real total: max_steps
    stamps = [_stamp(lines[i]) for i in [start, *(i for i, _ in steps)]]
    assert all(stamps), [lines[i] for i in [start, *(i for i, _ in steps)]]
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:], strict=False)]
    assert max(gaps) <= 30, gaps
    assert (run / "train.log").is_file() and "step 6/6" in (run / "train.log").read_text()  # run_dir= holds the log


@pytest.mark.slow  # a whole piped run (≈ 30-70 s on 2 cores); CI's slow step runs it
def test_piped_prune_with_reconstruction_logs_each_block_twice(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "prune.py", "model=tiny", "pruner=wanda", "sparsity=nm2_4",
                           "calibration=quick", "calibration.nsamples=4", "calibration.seqlen=64",
                           "reconstruct=blockwise", "reconstruct.nsamples=4", "reconstruct.seqlen=64",
                           "reconstruct.epochs=1", "save_model=false", f"data_dir={SAMPLE_DATA_DIR}",
                           f"cache_dir={tmp_path / 'cache'}", f"run_dir={tmp_path / 'pruned'}"],
                          cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    pruned = re.findall(r"prune wanda nm2_4: block (\d+)/2 ", proc.stdout)
    rebuilt = re.findall(r"reconstruct block (\d+)/2 ", proc.stdout)
    assert pruned == rebuilt == ["1", "2"], proc.stdout[-4000:]
    assert (tmp_path / "pruned" / "prune.log").is_file()


def _fit(bar: TQDMProgressBar, max_steps: int, accumulate: int = 1) -> None:
    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, _idx):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = DataLoader(TensorDataset(torch.randn(10, 2)), batch_size=1)
    trainer = L.Trainer(max_epochs=1, max_steps=max_steps, accumulate_grad_batches=accumulate, callbacks=[bar],
                        logger=False, enable_checkpointing=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(Tiny(), data)


@pytest.mark.parametrize("max_steps, accumulate, expected", [(4, 1, 4), (4, 2, 8), (-1, 1, 10), (40, 1, 10)])
def test_bar_total_is_the_batches_the_run_takes(max_steps, accumulate, expected):
    bar = StepBoundedTQDMBar()
    _fit(bar, max_steps, accumulate)
    assert bar.train_progress_bar.total == expected
    if expected < 10:  # negative control: Lightning's own bar counts the whole epoch (a real run showed "40/99")
        plain = TQDMProgressBar()
        _fit(plain, max_steps, accumulate)
        assert plain.train_progress_bar.total == 10


def test_lm_eval_bars_become_log_lines_outside_a_terminal(caplog, sample_data_dir, monkeypatch):
    import lm_eval.models.huggingface as hf

    from spp.eval.harness import evaluate_tasks
    from spp.models.tiny import tiny_llama, tiny_tokenizer

    original = hf.tqdm
    with lm_eval_bars_as_lines(io.StringIO()) as swapped:
        assert swapped and hf.tqdm is LineBar
    assert hf.tqdm is original  # restored
    tty = io.StringIO()
    tty.isatty = lambda: True  # type: ignore[method-assign]
    with lm_eval_bars_as_lines(tty) as swapped:  # negative control: a terminal keeps the bars
        assert not swapped and hf.tqdm is original
    err = io.StringIO()
    # a handler an earlier test left on a closed stream would dump "--- Logging error ---" (with the line) here
    monkeypatch.setattr(logging, "raiseExceptions", False)
    stderr, sys.stderr = sys.stderr, err
    try:
        with caplog.at_level(logging.INFO, logger="spp.eval.progress_lines"):
            evaluate_tasks(tiny_llama(seed=0), tiny_tokenizer(), ["spp_rte"], limit=3, data_dir=sample_data_dir)
    finally:
        sys.stderr = stderr
    assert "\r" not in err.getvalue() and "Running loglikelihood requests" not in err.getvalue()
    done = [r.getMessage() for r in caplog.records if r.name == "spp.eval.progress_lines"]
    assert any(m.startswith("Running loglikelihood requests: 6/6 in") for m in done), done  # 3 docs x 2 choices


def test_line_bar_throttles_its_lines(caplog):
    with caplog.at_level(logging.INFO, logger="spp.eval.progress_lines"):
        bar = LineBar(total=100, desc="work", every_s=3600)
        for _ in range(100):
            bar.update(1)
        bar.close()
        bar.close()
        assert list(LineBar(range(3), desc="quiet", disable=True)) == [0, 1, 2]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and messages[0].startswith("work: 100/100 in"), messages


def test_eval_stopped_during_its_tasks_keeps_the_perplexity(tmp_path, monkeypatch):
    import spp.eval.evaluate as evaluate_module
    from spp.eval.config import EvalConfig
    from spp.eval.job_config import EvalJobConfig
    from spp.eval.runner import PARTIAL_STATUS, run_eval_job
    from spp.models.config import ModelConfig

    def time_limit(*_a, **_k):
        raise TimeoutError("the job's time limit")

    monkeypatch.setattr(evaluate_module, "run_eval_tasks", time_limit)
    eval_cfg = EvalConfig(seqlen=48, max_windows=3, batch_size=1, tasks=["spp_rte"], limit=2)
    cfg = EvalJobConfig(model=ModelConfig(name="tiny", path="tiny"), eval=eval_cfg, data_dir=str(SAMPLE_DATA_DIR),
                        use_cache=False, accelerator="cpu", run_dir=str(tmp_path / "partial"))
    with pytest.raises(TimeoutError):
        run_eval_job(cfg, tmp_path / "partial")
    record = json.loads((tmp_path / "partial" / "results.json").read_text())["records"][0]
    assert record["ppl"]["wikitext2"]["ppl"] > 1 and record["info"]["status"] == PARTIAL_STATUS
    assert "partial" in (tmp_path / "partial" / "results.md").read_text()
    # negative control: a job without lm-eval tasks writes once, at the end, with no status
    done = EvalJobConfig(**{**cfg.__dict__, "eval": EvalConfig(seqlen=48, max_windows=3, batch_size=1, tasks=[]),
                            "run_dir": str(tmp_path / "done")})
    run_eval_job(done, tmp_path / "done")
    record = json.loads((tmp_path / "done" / "results.json").read_text())["records"][0]
    assert "status" not in record["info"] and record["ppl"]["wikitext2"]["ppl"] > 1


def test_log_progress_eta_after_a_resume_counts_only_the_steps_since_it():
    """Resumed at step 900 of 1000, 10 steps in 10 s: 90 steps are left at 1 s each (not 90 x 10 s / 910 steps)."""
    import time
    from types import SimpleNamespace

    from spp.training.callbacks.progress import LogProgress

    progress = LogProgress(every_s=0)
    progress.on_train_start(SimpleNamespace(global_step=900, estimated_stepping_batches=1000, max_epochs=1), None)
    now = time.perf_counter()
    progress._start = now - 10.0
    progress._line(910, 1000, now)
    assert progress.lines[-1].startswith("step 910/1000 (91%)") and "ETA 1m30s" in progress.lines[-1], progress.lines
