"""Exact mid-epoch resume: a training-loader wrapper that skips the batches already trained on.

Lightning 2.x restarts an interrupted epoch from its first batch, and a loader built before the loop state is
restored never gets its state back; so the data module checkpoints ``(epoch, batches done)`` itself. The count is
of this rank's shard: a resume on another world size is refused (``spp.training.resume_checks.check_world``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class ResumableLoader:
    """A ``DataLoader`` wrapper (len, sampler, dataset as the loader) that fast-forwards after a resume.

    ``position`` returns ``(epoch, batches done)`` from the trainer's loop; ``pending`` is the restored state."""

    def __init__(self, loader: Any, position: Callable[[], tuple[int, int]], pending: dict[str, int]) -> None:
        self.loader = loader
        self._position = position
        self._pending = pending

    def __getattr__(self, name: str) -> Any:
        """The wrapped loader's attributes (``sampler``, whose ``set_epoch`` Lightning calls; ``dataset``, ...)."""
        if name == "loader":  # not set yet (an unpickled copy): no recursion through ``self.loader``
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.loader)
        if self._pending:
            epoch, done = int(self._pending.pop("epoch", -1)), int(self._pending.pop("batches_done", 0))
            if epoch == self._position()[0] and 0 < done < len(self.loader):
                for _ in range(done):
                    next(iterator)
        yield from iterator


def trainer_position(trainer: Any) -> tuple[int, int]:
    """``(current epoch, batches processed in it)`` from Lightning's fit-loop progress."""
    loop = trainer.fit_loop
    return int(loop.epoch_progress.current.completed), int(loop.epoch_loop.batch_progress.current.processed)
