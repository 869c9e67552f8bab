"""Real DeepSpeed where it imports: ZeRO-2 and ZeRO-3 through ``train.py``'s job on 2 CPU processes (gloo).

Skipped where ``deepspeed`` is not importable (an optional extra: ``pip install -e ".[deepspeed]"``). DeepSpeed
itself runs on CPU (``DS_ACCELERATOR=cpu``); Lightning's ``DeepSpeedStrategy`` refuses anything but CUDA, so each
run is a child process (this file as a script) that lifts only those device checks (and the preflight's CUDA
refusal) before calling ``train.run_job`` on the tiny model: prune → adapter → ``AdapterDeepSpeedStrategy`` → audit
→ checkpoints → finalize. Every tensor of the tiny model is below DeepSpeed's ``stage3_param_persistence_threshold``
(1e5 elements), which would keep them all whole; the child sets it to 0, so ZeRO-3 partitions every parameter (the
export checks that it met them empty and 1-D). Checked against DDP on the same 2 processes:

- every training adapter trains alike under ZeRO-2 (bitwise) and ZeRO-3 (fp32 partitions: to 5e-5), and the audit
  (ZeRO-3 partitions gathered one layer at a time) passes at fit start, at every checkpoint and after the merge;
- the ZeRO-3 export (``config.json`` dtype ``float32``, the job's) loads with ``AutoModelForCausalLM`` to DDP's
  (logits to 1e-4) and the job's own evaluation reads it (merged perplexity as DDP's);
- DeepSpeed's checkpoint directory holds the adapter tensors only, and resuming from it continues exactly;
- negative controls: without the buffers broadcast from rank 0 the run departs from DDP; without masked full's
  gradient hook on the weight objects rank 1 trains, ZeRO-3 revives pruned weights and the audit stops the run.

Run: ``pytest -m slow tests/test_zero3_deepspeed.py`` with DeepSpeed installed (about 5 minutes).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not importable")]

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=2", "trainer.precision=32-true",
          "eval=none", "export.merged=false", "adapter.dropout=0.05"]


def _run(run_dir: Path, *overrides: str, patch: str = "") -> tuple[int, str, dict | None]:
    """``run_job`` of the tiny job in ``run_dir`` as a child process; (exit status, output, summary.json)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline",
           "SPP_TEST_PATCH": patch}
    env.pop("PYTEST_CURRENT_TEST", None)
    common = [c for c in COMMON if not (c.startswith("adapter.dropout") and "adapter=masked_full" in overrides)
              and c.split("=")[0] not in {o.split("=")[0] for o in overrides}]  # an override replaces its default
    proc = subprocess.run([sys.executable, __file__, str(run_dir), *common, *overrides], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    summary = run_dir / "run" / "summary.json"
    return proc.returncode, proc.stdout + proc.stderr, json.loads(summary.read_text()) if summary.exists() else None


EXPORTED = ["export.merged=true", "eval=default", "eval.seqlen=128", "eval.max_windows=2"]
"""Overrides after ``COMMON``: the merged export, evaluated by the job (2 perplexity windows)."""


@cache
def _ddp(adapter: str, root: str) -> dict:
    code, out, summary = _run(Path(root) / f"ddp_{adapter}", "strategy=ddp", f"adapter={adapter}", *EXPORTED)
    assert code == 0 and summary, out[-3000:]
    return summary


def _logits(folder: Path) -> torch.Tensor:
    """The logits of the export in ``folder`` loaded as ``AutoModelForCausalLM`` (dtype from its config)."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    ids = torch.randint(4, 260, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits.float()


def _adapter(summary: dict) -> dict[str, torch.Tensor]:
    path = Path(summary["outputs"]["adapter_dir"]) / "adapter_model.safetensors"
    return load_file(path) if path.exists() else {}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("zero"))


@pytest.mark.parametrize(("adapter", "stage"), [("spp", 2), ("spp", 3), ("sparse_lora", 3), ("lora", 3),
                                                ("masked_full", 3)])
def test_deepspeed_trains_every_adapter_like_ddp_and_audits_the_partitions(root: str, adapter: str,
                                                                           stage: int) -> None:
    run_dir = Path(root) / f"z{stage}_{adapter}"
    code, out, summary = _run(run_dir, f"strategy=deepspeed_stage{stage}", f"adapter={adapter}", *EXPORTED)
    assert code == 0 and summary, out[-3000:]
    reference = _ddp(adapter, root)
    tol = {"rtol": 0, "atol": 0} if stage == 2 else {"rtol": 1e-5, "atol": 5e-5}
    torch.testing.assert_close(torch.tensor(summary["losses"]["train"]), torch.tensor(reference["losses"]["train"]),
                               **tol)
    ours, theirs = _adapter(summary), _adapter(reference)
    assert ours.keys() == theirs.keys() and (ours or adapter == "masked_full")
    for key, value in theirs.items():
        torch.testing.assert_close(ours[key], value, **tol, msg=key)
    audits = summary["sparsity"]["audits"]
    whens = [a["when"] for a in audits]
    assert whens[0] == "fit_start" and whens[-1] == "merged" and "checkpoint@step6" in whens, whens
    assert all(a["layers"] == 14 and a["sparsity"] == 0.5 for a in audits)
    held = json.loads((run_dir / "run" / "held_at_export.json").read_text())
    assert held["partitioned"] == (held["total"] if stage == 3 else 0) and held["total"] > 0, held
    ours_dir, ddp_dir = run_dir / "run" / "merged", Path(reference["outputs"]["merged_dir"])
    assert json.loads((ours_dir / "config.json").read_text())["dtype"] == "float32"
    torch.testing.assert_close(_logits(ours_dir), _logits(ddp_dir), rtol=1e-4, atol=1e-4)
    assert summary["perplexity"]["merged"]["ppl"] == pytest.approx(reference["perplexity"]["merged"]["ppl"], rel=1e-4)


@pytest.mark.parametrize("stage", [2, 3])
def test_the_deepspeed_directory_holds_the_adapter_only_and_resumes_exactly(root: str, stage: int) -> None:
    first = Path(root) / f"resume_a{stage}"
    code, out, full = _run(first, f"strategy=deepspeed_stage{stage}", "trainer.checkpoint_every_n_steps=3",
                           "trainer.save_top_k=-1")
    assert code == 0 and full, out[-3000:]
    ckpts = first / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["adapter-step000003.ckpt", "adapter-step000006.ckpt",
                                                       "last.ckpt"]
    step3 = ckpts / "adapter-step000003.ckpt"
    names = sorted(p.name for p in (step3 / "checkpoint").iterdir())
    assert (step3 / "latest").read_text() == "checkpoint"
    if stage == 2:
        assert names == ["mp_rank_00_model_states.pt", *(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
                                                          for r in (0, 1))]
    else:
        assert names == [f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in (0, 1) for kind in ("model", "optim")]
    state = torch.load(step3 / "checkpoint" / names[0], map_location="cpu", weights_only=False)
    assert sorted(state["module"]) == state["adapter_keys"] and len(state["adapter_keys"]) == 28  # no frozen weight
    if stage == 2:
        assert sum(t.numel() for t in state["module"].values()) == full["params"]["trainable"]
    resumed_dir = Path(root) / f"resume_b{stage}"
    code, out, resumed = _run(resumed_dir, f"strategy=deepspeed_stage{stage}", f"trainer.resume_from={step3}")
    assert code == 0 and resumed, out[-3000:]
    assert len(full["losses"]["train"]) == 6 and resumed["losses"]["train"] == full["losses"]["train"]  # 1-3 restored
    with (resumed_dir / "run" / "csv" / "metrics.csv").open() as f:  # it resumed: this job logged steps 4-6 only
        assert sorted(int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")) == [3, 4, 5]
    ours, theirs = _adapter(resumed), _adapter(full)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)  # bitwise


def test_under_bf16_the_adapter_is_gathered_from_the_fp32_masters(root: str) -> None:
    """DeepSpeed casts the module to bf16 and keeps fp32 masters in its optimizer; the adapter comes from those."""
    run_dir = Path(root) / "bf16"
    code, out, summary = _run(run_dir, "strategy=deepspeed_stage3", "trainer.precision=bf16-mixed", *EXPORTED)
    assert code == 0 and summary, out[-3000:]
    tensors = _adapter(summary)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert not all(torch.equal(t.bfloat16().float(), t) for t in tensors.values())  # not the bf16 module copies
    merged = run_dir / "run" / "merged"  # DeepSpeed cast the module to bf16: so is the export, and it says so
    assert json.loads((merged / "config.json").read_text())["dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(next(merged.glob("model-00001-of-*.safetensors"))).values()} == {torch.bfloat16}
    model = AutoModelForCausalLM.from_pretrained(merged, dtype="auto")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert math.isfinite(summary["perplexity"]["merged"]["ppl"])


def test_without_the_buffer_broadcast_zero2_departs_from_ddp(root: str) -> None:
    code, out, summary = _run(Path(root) / "no_buffers", "strategy=deepspeed_stage2", patch="no_buffers")
    assert code == 0 and summary, out[-3000:]
    ours, theirs = _adapter(summary), _adapter(_ddp("spp", root))
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in theirs) > 1e-3  # rank 1's masks/rotary: garbage


def test_without_the_gradient_hook_masked_full_revives_pruned_weights_and_the_audit_stops_it(root: str) -> None:
    code, out, _ = _run(Path(root) / "no_hooks", "strategy=deepspeed_stage3", "adapter=masked_full",
                        patch="no_grad_hooks")
    assert code != 0 and "SparsityViolation" in out and "pruned by the mask are non-zero" in out, out[-3000:]


def _partition_everything(strategy: type) -> None:
    """ZeRO-3 keeps a parameter below ``stage3_param_persistence_threshold`` elements whole (all of the tiny
    model's): with 0 it partitions every one, as it does a real model's matrices."""
    init = strategy.__init__

    def partition_all(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0

    strategy.__init__ = partition_all


def _record_how_the_export_found_the_model(path: Path) -> None:
    """Before the export: how many of rank 0's parameters are ZeRO-3 partitions (``ds_id``, empty, 1-D)."""
    import spp.training.finalize as finalize

    export = finalize.export

    def recording(job: Any, pruned: Any, fitted: Any, *args: Any) -> Any:
        params = list(fitted.model.parameters())
        if fitted.is_global_zero:
            partitioned = [p for p in params if hasattr(p, "ds_id") and p.data.dim() == 1 and p.data.numel() == 0]
            path.write_text(json.dumps({"total": len(params), "partitioned": len(partitioned)}))
        return export(job, pruned, fitted, *args)

    finalize.export = recording


def _main(run_dir: str, *overrides: str) -> None:
    """Child process: lift Lightning's and the preflight's CUDA-only checks, then run the job."""
    import argparse
    import types

    import lightning.pytorch.strategies.deepspeed as lightning_deepspeed
    from lightning.pytorch.strategies import DDPStrategy
    from train_helpers import tiny_job

    import spp.preflight.jobs
    import spp.training.module
    import spp.training.strategies
    from train import run_job

    strategy = lightning_deepspeed.DeepSpeedStrategy
    strategy.setup_environment = lambda self: DDPStrategy.setup_environment(self)
    lightning_deepspeed._validate_device_index_selection = lambda devices: None
    lightning_deepspeed.argparse = types.SimpleNamespace(  # a CPU device has no index: DeepSpeed wants an int
        Namespace=lambda device_rank=None, **kw: argparse.Namespace(device_rank=-1 if device_rank is None
                                                                    else device_rank, **kw))
    spp.preflight.jobs.check_deepspeed = spp.training.strategies.check_deepspeed = lambda *a, **k: None
    _partition_everything(spp.training.strategies.AdapterDeepSpeedStrategy)
    _record_how_the_export_found_the_model(Path(run_dir) / "run" / "held_at_export.json")
    patch = os.environ.get("SPP_TEST_PATCH", "")
    if patch == "no_buffers":
        spp.training.strategies.broadcast_state = lambda model, ctx, parameters=True: None
    if patch == "no_grad_hooks":
        spp.training.module.SPPModule._after_placement = lambda self: None  # masked_full: no hooks after placement
    run_job(tiny_job(Path(run_dir), *overrides))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _main(*sys.argv[1:])
