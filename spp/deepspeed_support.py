"""What ``strategy=deepspeed_stage2|3`` needs before any weight is read, and DeepSpeed's checkpoint directory.

It sits below ``spp.training`` so ``spp.preflight`` can use it."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

import torch

from spp.errors import UserError

LATEST_FILE = "latest"
"""DeepSpeed's file naming the newest tag of a checkpoint directory."""
CLIENT_STATE_FILES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
"""The file of a tag directory holding Lightning's client state (``spp_settings``, loops, callbacks): ZeRO-2's,
then ZeRO-3's rank-0 file."""


def is_deepspeed(strategy: Any) -> bool:
    """Whether the ``strategy`` group (``StrategyConfig``) selects DeepSpeed."""
    return strategy.name == "deepspeed"  # a StrategyName (a Choice: equal to its value) or a plain str


def check_deepspeed(strategy: Any, accelerator: str, adapter: Any = None) -> None:
    """Refuse, before any weight is read, a DeepSpeed job that cannot run here: DeepSpeed missing, no CUDA GPU
    (Lightning's DeepSpeed runs on CUDA only), or an adapter that cannot train under ZeRO-3 (``adapter=None`` skips)."""
    if not is_deepspeed(strategy):
        return
    label = f"strategy=deepspeed_stage{strategy.stage}"
    if strategy.stage == 3 and adapter is not None and adapter.zero3_refusal:
        raise UserError(f"{label}: adapter.name={adapter.name} cannot train under ZeRO-3: {adapter.zero3_refusal}",
                        "use strategy=deepspeed_stage2 or strategy=fsdp, or another adapter.name", key="strategy")
    if importlib.util.find_spec("deepspeed") is None:
        raise UserError(f"{label} needs DeepSpeed, which is not installed",
                        "`pip install deepspeed` on a GPU machine, or choose strategy=fsdp / strategy=ddp",
                        key="strategy")
    if accelerator == "cpu" or not torch.cuda.is_available():
        raise UserError(f"{label} needs CUDA GPUs (Lightning's DeepSpeed strategy runs on CUDA only), and "
                        f"{'trainer.accelerator=cpu' if accelerator == 'cpu' else 'no CUDA GPU is visible'}",
                        "run on GPUs (trainer=gpu), or use strategy=fsdp / strategy=ddp (they run on CPU with gloo)",
                        key="strategy")
    try:
        importlib.import_module("deepspeed")
    except Exception as err:  # noqa: BLE001 - any import failure is the installation's problem
        raise UserError(f"{label}: `import deepspeed` fails: {type(err).__name__}: {err}",
                        "repair the DeepSpeed installation (`pip install -U deepspeed`), or choose strategy=fsdp",
                        key="strategy") from err


def client_state_file(path: str | Path) -> Path | None:
    """The file of a DeepSpeed checkpoint directory that holds Lightning's client state, or ``None``: in its tag
    directory (from ``<path>/latest``, else the only sub-directory with a model-states file)."""
    root = Path(path)
    if not root.is_dir():
        return None
    latest = root / LATEST_FILE
    if latest.is_file():
        tag = latest.read_text().strip()
        candidates = [root / tag] if tag else []
    else:
        candidates = sorted(p for p in root.iterdir() if p.is_dir())
    found = [c for c in candidates if any((c / name).is_file() for name in CLIENT_STATE_FILES)]
    if len(found) != 1:
        return None
    return next(found[0] / name for name in CLIENT_STATE_FILES if (found[0] / name).is_file())


def check_resume_format(strategy: Any, checkpoint: str | Path) -> Path:
    """The file holding ``checkpoint``'s client state, after checking the strategy can load it (DeepSpeed only its own
    directories of the same stage, the others only ``.ckpt`` files)."""
    state = client_state_file(checkpoint)
    if is_deepspeed(strategy) and state is None:
        raise UserError(f"trainer.resume_from={str(checkpoint)!r} is not a DeepSpeed checkpoint directory, and "
                        f"strategy=deepspeed_stage{strategy.stage} resumes from those only",
                        "resume with the strategy that wrote it, or give a checkpoint written under DeepSpeed",
                        key="trainer.resume_from")
    if is_deepspeed(strategy) and (strategy.stage == 3) != state.name.startswith("zero_pp_rank_"):
        written = 3 if state.name.startswith("zero_pp_rank_") else 2
        raise UserError(f"trainer.resume_from={str(checkpoint)!r} was written under ZeRO stage {written}, and "
                        f"strategy=deepspeed_stage{strategy.stage} cannot load it",
                        f"resume with strategy=deepspeed_stage{written}", key="trainer.resume_from")
    if not is_deepspeed(strategy) and state is not None:
        raise UserError(f"trainer.resume_from={str(checkpoint)!r} is a DeepSpeed checkpoint directory, which "
                        f"strategy={getattr(strategy.name, 'value', strategy.name)} cannot load",
                        "resume with the DeepSpeed strategy that wrote it (strategy=deepspeed_stage2|3)",
                        key="trainer.resume_from")
    return state if state is not None else Path(checkpoint)
