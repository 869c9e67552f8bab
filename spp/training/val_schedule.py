"""Whether a training job will log a validation loss, known before anything is loaded (an Optuna sweep returns
each job's last ``val/loss``, and would only say it got none after every trial): :func:`no_validation_reason`.
"""

from __future__ import annotations

import math
from typing import Any

from spp.adapters.base import AdapterMethod
from spp.data.config import HUB_PREFIX, validation_split_size
from spp.data.records import load_alpaca_records
from spp.errors import UserError
from spp.pruning.resolve import resolve_adapter
from spp.training.config import TrainJobConfig
from spp.training.resume_checks import world_of
from spp.training.trainer import accumulation


def first_validation_batch(val_check_interval: Any, batches_per_epoch: int) -> int | None:
    """Lightning's ``val_check_batch``: the training batch of each epoch after which validation first runs.

    ``None`` for a time-based interval (or anything else Lightning decides at run time).
    """
    if isinstance(val_check_interval, bool):
        return None
    if isinstance(val_check_interval, int):
        return val_check_interval
    if isinstance(val_check_interval, float) and 0.0 < val_check_interval <= 1.0:
        return max(1, int(batches_per_epoch * val_check_interval))
    return None


def training_batches_per_epoch(job: TrainJobConfig) -> int | None:
    """Training batches per epoch on each rank, from the records of ``data.source``; ``None`` when unknowable
    before tokenising (hub source, unreadable file, or ``data.train_on_inputs=false``)."""
    data = job.data
    if data.source.startswith(HUB_PREFIX) or not data.train_on_inputs:
        return None
    try:
        n = len(load_alpaca_records(data.source, job.data_dir).records)
    except (OSError, ValueError):
        return None
    n = min(n, data.max_examples) if data.max_examples is not None else n
    return batches_per_rank(job, n - validation_split_size(n, data.val_size, data.max_val_fraction))


def batches_per_rank(job: TrainJobConfig, n_train: int) -> int:
    """Training batches per epoch on each rank for ``n_train`` training examples (``DistributedSampler`` pads the
    shards to ``ceil(n_train / world size)``)."""
    return math.ceil(math.ceil(n_train / world_of(job)["world_size"]) / job.data.train_batch_size)


def check_validation_interval(job: TrainJobConfig, n_train: int) -> None:
    """Refuse an int ``trainer.val_check_interval`` above the epoch's training batches on each rank (Lightning
    refuses it only once the model is pruned, and not with ``trainer.limit_val_batches=0``), in one line naming the
    largest value that works."""
    interval, batches = job.trainer.val_check_interval, batches_per_rank(job, n_train)
    validates = float(job.trainer.limit_val_batches) > 0
    if isinstance(interval, int) and not isinstance(interval, bool) and interval > batches and validates:
        raise UserError(f"trainer.val_check_interval={interval} is more than the {batches} training batches of an "
                        f"epoch on each of the {world_of(job)['world_size']} rank(s) ({n_train} examples, "
                        f"data.train_batch_size={job.data.train_batch_size}), so validation never runs",
                        f"set trainer.val_check_interval to at most {batches} (an int counts batches), or a float "
                        "share of the epoch such as 1.0", key="trainer.val_check_interval")


def no_validation_reason(job: TrainJobConfig, method: AdapterMethod | None = None) -> str | None:
    """Why ``job`` will log no validation loss, as ``"<what> — <fix>"``; ``None`` when it will (or may).
    ``method``: the job's resolved adapter method (resolved here when not given)."""
    tcfg, data = job.trainer, job.data
    if not (method if method is not None else resolve_adapter(job.adapter.name)).trains:
        return f"adapter={job.adapter.name} trains nothing, so nothing is validated — choose a trained adapter"
    if isinstance(tcfg.limit_val_batches, (int, float)) and float(tcfg.limit_val_batches) == 0.0:
        return (f"trainer.limit_val_batches={tcfg.limit_val_batches} runs no validation batch — "
                "set trainer.limit_val_batches>0")
    if data.val_size == 0:
        return "data.val_size=0 holds out no validation record — set data.val_size>0 (e.g. data.val_size=4)"
    batches = training_batches_per_epoch(job)
    if batches is None or tcfg.max_steps == -1:
        return None
    try:
        accumulate = accumulation(job)
    except ValueError:
        return None  # preflight names the batch sizes
    first = first_validation_batch(tcfg.val_check_interval, batches)
    trained = tcfg.max_steps * accumulate
    if first is None or first > batches or tcfg.max_steps >= math.ceil(batches / accumulate) or trained >= first:
        return None
    return (f"trainer.max_steps={tcfg.max_steps} stops after {trained} of the epoch's {batches} training batches, "
            f"before the first validation (trainer.val_check_interval={tcfg.val_check_interval}: after batch "
            f"{first}) — validate within the run with trainer.val_check_interval={max(1, trained // 2)} (an int: "
            f"every that many batches), or raise trainer.max_steps to {math.ceil(first / accumulate)} or more")
