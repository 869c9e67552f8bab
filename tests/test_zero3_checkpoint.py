"""DeepSpeed on this CPU machine without DeepSpeed: checkpoint directories, resume resolution, and the refusals.

DeepSpeed writes a checkpoint as a directory (``<name>.ckpt/latest``, ``<name>.ckpt/checkpoint/*_states.pt``,
``spp.deepspeed_support``); the layouts below are the ones DeepSpeed 0.19.8 wrote through Lightning 2.6 in
``tests/test_zero3_deepspeed.py`` (run where DeepSpeed imports). Here: ``trainer.resume_from`` resolution and the
preflight's settings check accept such a directory (and ``last`` linking to one), a mismatched strategy or stage
is refused in one line, ``AdapterCheckpoint``'s naming, top-k and ``last.ckpt`` link work when each checkpoint is a
directory, and a DeepSpeed job without DeepSpeed or without CUDA ends in one line before any weight is read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn
from train_helpers import compose_train, tiny_job

from spp.deepspeed_support import check_resume_format, client_state_file
from spp.errors import UserError
from spp.paths import REPO_ROOT
from spp.preflight.jobs import preflight_train
from spp.training.callbacks.adapter_checkpoint import AdapterCheckpoint, resolve_resume
from spp.training.config import StrategyConfig, StrategyName
from spp.training.resume_checks import check_resume, settings_of

ZERO2 = StrategyConfig(name=StrategyName.deepspeed, stage=2)
ZERO3 = StrategyConfig(name=StrategyName.deepspeed, stage=3)
DDP = StrategyConfig(name=StrategyName.ddp)


def fake_deepspeed_checkpoint(path: Path, stage: int, ranks: int = 2, client: dict[str, Any] | None = None) -> Path:
    """The directory DeepSpeed's ``save_checkpoint(path, tag="checkpoint")`` writes (ZeRO-2: one model-states file;
    ZeRO-3: one per rank; bf16 optimizer partitions under ZeRO-3 as with ``precision=bf16-mixed``)."""
    tag = path / "checkpoint"
    tag.mkdir(parents=True)
    (path / "latest").write_text("checkpoint")
    (path / "zero_to_fp32.py").write_text("# DeepSpeed's consolidation script\n")
    state = {"module": {}, "ds_version": "0.19.8", **(client or {})}
    names = ["mp_rank_00_model_states.pt"] if stage == 2 else [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"
                                                                 for r in range(ranks)]
    for name in names:
        torch.save(state, tag / name)
    prefix = "" if stage == 2 else "bf16_"
    for r in range(ranks):
        torch.save({"optimizer_state_dict": {}}, tag / f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    return path


# ------------------------------------------------------------------------------------------------ resolution


@pytest.mark.parametrize("stage", [2, 3])
def test_resume_resolves_a_deepspeed_directory_and_last_linking_to_it(tmp_path: Path, stage: int) -> None:
    ckpts = tmp_path / "checkpoints"
    step = fake_deepspeed_checkpoint(ckpts / "adapter-step000200.ckpt", stage)
    (ckpts / "last.ckpt").symlink_to("adapter-step000200.ckpt")
    assert resolve_resume(str(step), ckpts) == str(step)
    assert resolve_resume("last", ckpts) == str(ckpts / "last.ckpt")
    expected = "mp_rank_00_model_states.pt" if stage == 2 else "zero_pp_rank_0_mp_rank_00_model_states.pt"
    assert client_state_file(ckpts / "last.ckpt") == ckpts / "last.ckpt" / "checkpoint" / expected
    (step / "latest").unlink()  # without ``latest``: the only tag directory holding a model-states file
    assert client_state_file(step).name == expected


def test_resume_names_what_is_wrong_with_a_directory(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    step = fake_deepspeed_checkpoint(ckpts / "adapter-step000010.ckpt", 3)
    inner = step / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    for given in (step / "checkpoint", inner):  # a path inside the checkpoint: give the directory itself
        with pytest.raises(FileNotFoundError, match=rf"inside the DeepSpeed checkpoint {step}; give "
                                                    rf"trainer.resume_from={step}"):
            resolve_resume(str(given), ckpts)
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileNotFoundError, match="is a directory but not a DeepSpeed checkpoint"):
        resolve_resume(str(tmp_path / "plain"), ckpts)
    with pytest.raises(FileNotFoundError, match=r"trainer.resume_from='last': no checkpoint at"):
        resolve_resume("last", tmp_path / "none")
    ordinary = ckpts / "adapter-step000005.ckpt"
    torch.save({}, ordinary)  # a .ckpt file beside DeepSpeed directories stays a file checkpoint
    assert resolve_resume(str(ordinary), ckpts) == str(ordinary)


def test_the_strategy_must_match_the_checkpoint_format(tmp_path: Path) -> None:
    zero2 = fake_deepspeed_checkpoint(tmp_path / "z2.ckpt", 2)
    zero3 = fake_deepspeed_checkpoint(tmp_path / "z3.ckpt", 3)
    plain = tmp_path / "plain.ckpt"
    torch.save({}, plain)
    assert check_resume_format(ZERO2, zero2) == zero2 / "checkpoint" / "mp_rank_00_model_states.pt"
    assert check_resume_format(ZERO3, zero3).name == "zero_pp_rank_0_mp_rank_00_model_states.pt"
    assert check_resume_format(DDP, plain) == plain
    cases = [(DDP, zero3, "is a DeepSpeed checkpoint directory, which strategy=ddp cannot load"),
             (ZERO3, plain, "is not a DeepSpeed checkpoint directory, and strategy=deepspeed_stage3 resumes"),
             (ZERO3, zero2, "was written under ZeRO stage 2, and strategy=deepspeed_stage3 cannot load it"),
             (ZERO2, zero3, "was written under ZeRO stage 3, and strategy=deepspeed_stage2 cannot load it")]
    for strategy, path, message in cases:
        with pytest.raises(UserError, match=message) as err:
            check_resume_format(strategy, path)
        assert err.value.key == "trainer.resume_from" and "\n" not in str(err.value)


def test_preflight_compares_the_settings_stored_in_a_deepspeed_directory(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "strategy=deepspeed_stage3")
    step = fake_deepspeed_checkpoint(tmp_path / "adapter-step000003.ckpt", 3,
                                     client={"spp_settings": settings_of(job), "adapter_keys": []})
    check_resume(job, step)  # the same settings: accepted
    other = tiny_job(tmp_path, "strategy=deepspeed_stage3", "trainer.lr=0.5")
    with pytest.raises(UserError, match=r"was written with other settings: trainer.lr=0.5 \(checkpoint: "):
        check_resume(other, step)


# ------------------------------------------------------------------------------------------------ AdapterCheckpoint


class _DirectoryCheckpoints(SingleDeviceStrategy):
    """Writes and reads checkpoints as DeepSpeed does (a directory; the client state without ``state_dict``)."""

    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Any = None) -> None:
        client = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        fake_deepspeed_checkpoint(Path(filepath), 2, ranks=1, client=client)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = client_state_file(checkpoint_path)
        assert path is not None, checkpoint_path
        return torch.load(path, weights_only=False)

    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        """DeepSpeed's engine has loaded the module already."""

    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        """... and the optimizer."""

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.loaded: list[dict[str, Any]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.loaded.append(checkpoint)


def _fit(tmp_path: Path, steps: int, resume: str | None = None) -> tuple[L.Trainer, _Tiny]:
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=2)
    module = _Tiny()
    trainer = L.Trainer(strategy=_DirectoryCheckpoints(torch.device("cpu")), max_steps=steps, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[AdapterCheckpoint(tmp_path / "checkpoints", every_n_train_steps=2, save_top_k=2)])
    trainer.fit(module, data, ckpt_path=resume)
    return trainer, module


def test_adapter_checkpoint_names_keeps_top_k_and_links_last_with_directories(tmp_path: Path) -> None:
    _fit(tmp_path, 8)
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["adapter-step000006.ckpt", "adapter-step000008.ckpt",
                                                       "last.ckpt"]  # top 2 kept, older directories removed
    assert all((ckpts / n).is_dir() for n in ("adapter-step000006.ckpt", "adapter-step000008.ckpt"))
    assert (ckpts / "last.ckpt").is_symlink() and os.readlink(ckpts / "last.ckpt") == "adapter-step000008.ckpt"
    resumed = resolve_resume("last", ckpts)
    trainer, module = _fit(tmp_path, 10, resume=resumed)
    assert module.loaded and module.loaded[0]["global_step"] == 8 and trainer.global_step == 10
    assert os.readlink(ckpts / "last.ckpt") == "adapter-step000010.ckpt"
    assert sorted(p.name for p in ckpts.iterdir()) == ["adapter-step000008.ckpt", "adapter-step000010.ckpt",
                                                       "last.ckpt"]


def test_the_module_checks_a_deepspeed_client_state_by_its_adapter_keys() -> None:
    from spp.training.config import TrainerConfig
    from spp.training.module import SPPModule

    module = SPPModule(nn.Sequential(nn.Linear(2, 2)), TrainerConfig())
    module.trainable_names = ["0.weight", "0.bias"]
    module.on_load_checkpoint({"adapter_keys": ["model.0.bias", "model.0.weight"]})  # no state_dict: DeepSpeed
    with pytest.raises(ValueError, match=r"checkpoint lacks 1 adapter tensor\(s\), e.g. \['model.0.bias'\]"):
        module.on_load_checkpoint({"adapter_keys": ["model.0.weight"]})


# ------------------------------------------------------------------------------------------------ refusals


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_preflight_refuses_deepspeed_here_before_any_weight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import spp.preflight.jobs

    class Reached(Exception):
        """Preflight got past the strategy checks to the first file it reads (the model's config)."""

    def model_arch(*args: Any) -> None:
        raise Reached

    monkeypatch.setattr(spp.preflight.jobs, "model_arch", model_arch)
    installed = importlib.util.find_spec("deepspeed") is not None
    for stage in (2, 3):
        with pytest.raises(UserError, match="needs CUDA GPUs" if installed else "needs DeepSpeed, which is not"):
            preflight_train(tiny_job(tmp_path, f"strategy=deepspeed_stage{stage}"))
    with pytest.raises(Reached):  # adapter=none trains nothing: no Trainer, no strategy
        preflight_train(tiny_job(tmp_path, "strategy=deepspeed_stage3", "adapter=none"))


def test_a_method_that_cannot_train_under_zero3_is_refused_first(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from spp.adapters import get_method

    monkeypatch.setattr(type(get_method("lora")), "zero3_refusal", "it reads weights in a way ZeRO-3 cannot see")
    with pytest.raises(UserError, match=r"strategy=deepspeed_stage3: adapter.name=lora cannot train under ZeRO-3: it "
                                        r"reads .* — use strategy=deepspeed_stage2 or strategy=fsdp"):
        preflight_train(tiny_job(tmp_path, "strategy=deepspeed_stage3", "adapter=lora"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_authors_30b_deepspeed_recipe_composes_and_is_refused_before_any_weight(tmp_path: Path) -> None:
    from spp.training.config import load_job
    from train import run_job

    job = load_job(compose_train(["experiment=llama30b_deepspeed", f"run_dir={tmp_path / 'run'}"]))
    assert (str(job.strategy.name), job.strategy.stage, job.adapter.name, job.trainer.global_batch_size) == (
        "deepspeed", 3, "spp", 256)
    with pytest.raises(UserError, match=r"^strategy=deepspeed_stage3 needs ") as err:
        run_job(job)  # preflight: before the run lock, the config copy, or any file of the (absent) 30B model
    assert err.value.key == "strategy" and not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_authors_30b_deepspeed_recipe_on_the_command_line(tmp_path: Path) -> None:
    """``python train.py experiment=llama30b_deepspeed [--cfg job]`` as a user types it (9 s per command)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline"}
    base = [sys.executable, str(REPO_ROOT / "train.py"), "experiment=llama30b_deepspeed",
            f"hydra.run.dir={tmp_path / 'hydra'}", f"run_dir={tmp_path / 'run'}"]
    shown = subprocess.run([*base, "--cfg", "job"], env=env, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "name: deepspeed" in shown.stdout and "stage: 3" in shown.stdout and "global_batch_size: 256" in shown.stdout
    run = subprocess.run(base, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2, run.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("train.py: error: strategy=deepspeed_stage3 needs "), lines
    assert not (tmp_path / "run").exists()
