"""The resume checks: the settings a checkpoint is written with (``spp_settings``, stored by
:class:`~spp.training.callbacks.guards.GuardsCallback`) compared with the job's before any weight is loaded."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from spp.deepspeed_support import check_resume_format
from spp.errors import UserError, user_file

log = logging.getLogger(__name__)


RESUME_DATA_KEYS = ("source", "hub_split", "max_length", "add_eos", "train_on_inputs", "val_size", "max_val_fraction",
                    "max_examples", "seed", "train_batch_size", "pad_to_multiple_of", "padding_side", "shuffle")
"""``data.*`` keys that decide which examples a resumed run sees, in which order and batches."""
RESUME_TRAINER_KEYS = ("lr", "weight_decay", "betas", "warmup_ratio", "scheduler", "global_batch_size",
                       "accumulate_grad_batches", "gradient_clip_val")
"""``trainer.*`` keys that decide the optimisation (``max_steps`` / ``max_epochs`` may change: a resume may extend a
run, the schedule then follows the new length)."""


def _plain(obj: Any, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    return {k: (v if isinstance(v, (bool, int, float, list, type(None))) else str(v)) for k, v in vars(obj).items()
            if keys is None or k in keys}


def pruning_settings(job: Any) -> dict[str, dict[str, Any]]:
    """What decides the pruned weights, as ``settings_of`` groups: the model files' content identity
    (``model.weights``), the pruning cache key's pruner and calibration fields (with the calibration file's sha256),
    the pruning code version and the key's digest (``pruning.*``)."""
    from spp.models.loading import model_identity
    from spp.pruning.cache import cache_key

    if job.pruner.name == "none" or job.sparsity.is_dense:
        return {"model": {"weights": model_identity(job.model)}}
    key, digest = cache_key(job.model, job.pruner, job.sparsity, job.calibration, job.data_dir)
    groups = {"model": {"weights": key["model"]}, "pruner": dict(key["pruner"]),
              "pruning": {"code_version": key["code_version"], "cache_key": digest[:16]}}
    if "calibration" in key:
        groups["calibration"] = dict(key["calibration"])
    return groups


def settings_of(job: Any) -> dict[str, Any]:
    """The settings a checkpoint must match to be resumed (stored as ``spp_settings``): the adapter, the model (name,
    path, content identity), everything that decides the pruned weights (:func:`pruning_settings`), the data and
    the optimisation (:data:`RESUME_DATA_KEYS`, :data:`RESUME_TRAINER_KEYS`)."""
    pruning = pruning_settings(job)
    return {"adapter": _plain(job.adapter),
            "model": {"name": job.model.name, "path": job.model.path, **pruning.pop("model")},
            "pruner": {"name": job.pruner.name, **pruning.pop("pruner", {})}, "sparsity": _plain(job.sparsity),
            **pruning, "data": _plain(job.data, RESUME_DATA_KEYS), "trainer": _plain(job.trainer, RESUME_TRAINER_KEYS)}


def compare_settings(saved: dict[str, Any], now: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(differences, not saved)``: ``key=value (checkpoint: value)`` for every key the checkpoint holds with
    another value (or that the job no longer has), and the keys the checkpoint predates (``group.*`` for a group)."""
    diffs: list[str] = []
    unsaved: list[str] = []
    for group, values in now.items():
        old = saved.get(group)
        if not isinstance(old, dict):
            unsaved.append(f"{group}.*")
            continue
        unsaved += [f"{group}.{k}" for k in values if k not in old]
        diffs += [f"{group}.{k}={values.get(k)!r} (checkpoint: {v!r})" for k, v in old.items() if values.get(k) != v]
    return diffs, unsaved


def check_resume(job: Any, checkpoint: str | os.PathLike[str]) -> None:
    """Compare a resume checkpoint's ``spp_settings`` with the job; name every key that differs. Settings the
    checkpoint predates (written by an older version) are not compared: a warning names them."""
    state_file = check_resume_format(job.strategy, checkpoint)  # a DeepSpeed directory: the file of its client state
    with user_file(checkpoint, "trainer.resume_from"):
        ckpt = torch.load(state_file, map_location="cpu", weights_only=False, mmap=True)
    saved = ckpt.get("spp_settings") if isinstance(ckpt, dict) else None
    if not saved:
        log.warning("preflight: %s holds no spp_settings (written before they were saved); not compared", checkpoint)
        return
    diffs, unsaved = compare_settings(saved, settings_of(job))
    if diffs:
        raise UserError(f"trainer.resume_from={str(checkpoint)!r} was written with other settings: {', '.join(diffs)}",
                        "resume with the checkpoint's settings, or start a new run without trainer.resume_from",
                        key="trainer.resume_from")
    if unsaved:
        log.warning("preflight: %s was written before these settings were saved, so they are not compared: %s",
                    checkpoint, ", ".join(unsaved))
