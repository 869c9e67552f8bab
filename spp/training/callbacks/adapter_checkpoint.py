"""``AdapterCheckpoint``: small resumable checkpoints holding only the adapter tensors.

``SPPModule.on_save_checkpoint`` drops the frozen pruned weights from ``state_dict`` (they come back from the
pruning cache on resume) and ``strict_loading = False`` lets Lightning load the partial state; optimizer,
scheduler and loop states are kept, so ``trainer.resume_from=...`` continues exactly.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint


class AdapterCheckpoint(ModelCheckpoint):
    """A ``ModelCheckpoint`` writing ``adapter-stepNNNNNN.ckpt`` under ``<run_dir>/checkpoints`` and ``last.ckpt``
    as a symbolic link to the newest of them (one file per saved step).

    Args:
        dirpath: Checkpoint directory.
        every_n_train_steps: Save every N optimiser steps; ``None`` saves at each epoch end.
        save_top_k: How many step checkpoints to keep (``-1`` = all).
    """

    def __init__(self, dirpath: str | Path, every_n_train_steps: int | None = None, save_top_k: int = 1) -> None:
        super().__init__(
            dirpath=str(dirpath),
            filename="adapter-step{step:06d}",
            auto_insert_metric_name=False,
            every_n_train_steps=every_n_train_steps,
            save_top_k=save_top_k,
            monitor="step" if save_top_k not in (-1, 0, 1) else None,
            mode="max",
            save_last="link",  # last.ckpt is a link to the newest step file, never a second copy of it
            save_on_train_epoch_end=True,
        )


def resolve_resume(resume_from: str | None, checkpoint_dir: Path) -> str | None:
    """Turn ``trainer.resume_from`` into a checkpoint path (``last`` = ``<run_dir>/checkpoints/last.ckpt``).

    Raises:
        FileNotFoundError: the named checkpoint does not exist (names the key).
    """
    if not resume_from:
        return None
    path = checkpoint_dir / "last.ckpt" if resume_from == "last" else Path(resume_from).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"trainer.resume_from={resume_from!r}: no checkpoint at {path}; give a .ckpt path written by a run "
            "(<run_dir>/checkpoints/*.ckpt)"
        )
    return str(path)
