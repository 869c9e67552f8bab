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


def pruning_groups(job: Any, identity: Any = None) -> dict[str, dict[str, Any]]:
    """What decides the frozen weights, as ``settings_of`` groups: the model's content identity, the pruning
    cache key's fields, code version and digest, and the reconstruction key's digest (``None`` without one)
    (``identity``: computed here when not given, with the job's resolved reconstruction form)."""
    if identity is None:
        from spp.pruning.resolve import resolve_form  # start-up time, as below
        from spp.training.run import pruning_identity  # start-up time: a preflight refusal never loads transformers

        identity = pruning_identity(job, resolve_form(job.reconstruct))
    if identity.key is None:
        return {"model": {"weights": identity.model}}
    key, rebuilt = identity.key, identity.reconstruction
    return {"model": {"weights": key["model"]}, "pruner": dict(key["pruner"]),
            "pruning": {"code_version": key["code_version"], "cache_key": identity.digest[:16]},
            **({"calibration": dict(key["calibration"])} if "calibration" in key else {}),
            "reconstruction": {"cache_key": rebuilt[1][:16] if rebuilt is not None else None}}


def world_of(job: Any) -> dict[str, Any]:
    """``{"devices", "num_nodes", "world_size", "strategy"}`` of ``job``: ``trainer.devices`` as a count (``auto``:
    the visible GPUs), and the strategy with ``auto`` resolved (``ddp`` over several processes, else ``single``)."""
    from spp.planning.job import accelerator_kind, device_count, strategy_name  # start-up time: loads transformers

    devices = device_count(job.trainer.devices, accelerator_kind(str(job.trainer.accelerator), plan_only=False))
    nodes = int(job.trainer.num_nodes)
    return {"devices": devices, "num_nodes": nodes, "world_size": devices * nodes,
            "strategy": strategy_name(job, devices * nodes)}


def settings_of(job: Any, identity: Any = None) -> dict[str, Any]:
    """The settings a checkpoint must match to be resumed (stored as ``spp_settings``): adapter, model,
    :func:`pruning_groups`, training objective, data and optimisation keys, and the processes (:func:`world_of`)."""
    pruning = pruning_groups(job, identity)
    return {"world": world_of(job), "adapter": _plain(job.adapter),
            "model": {"name": job.model.name, "path": job.model.path, **pruning.pop("model")},
            "pruner": {"name": job.pruner.name, **pruning.pop("pruner", {})}, "sparsity": _plain(job.sparsity),
            **pruning, "objective": _plain(job.objective), "data": _plain(job.data, RESUME_DATA_KEYS),
            "trainer": _plain(job.trainer, RESUME_TRAINER_KEYS)}


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


def _world_text(world: dict[str, Any]) -> str:
    """``trainer.devices=2 trainer.num_nodes=1 strategy=ddp`` (an older checkpoint, which did not record them: its
    world size alone)."""
    if "devices" not in world:
        return "a version that did not record trainer.devices, trainer.num_nodes and strategy"
    return f"trainer.devices={world['devices']} trainer.num_nodes={world['num_nodes']} strategy={world['strategy']}"


def check_world(checkpoint: str | os.PathLike[str], saved: dict[str, Any] | None, now: dict[str, Any]) -> None:
    """Refuse a resume on another world size or strategy, in one line naming both.

    Data position, per-rank RNG states and optimiser layout map to no other world size or strategy; the
    ``devices`` x ``num_nodes`` split may differ. ``saved`` is ``None`` for an older checkpoint (strategy unchecked)."""
    if saved is None or "strategy" not in saved:
        log.warning("preflight: %s predates the record of trainer.devices, trainer.num_nodes and strategy; %s",
                    checkpoint, "not compared" if saved is None else
                    f"its random states give {saved['world_size']} process(es), the strategy is not compared")
    if saved is None:
        return
    other_size = saved["world_size"] != now["world_size"]
    if other_size or saved.get("strategy", now["strategy"]) != now["strategy"]:
        raise UserError(f"trainer.resume_from={str(checkpoint)!r} was written with {_world_text(saved)} "
                        f"({saved['world_size']} process(es)); this job has {_world_text(now)} "
                        f"({now['world_size']} process(es)): a checkpoint's data position, random states and "
                        "optimiser state do not map to another world size or strategy",
                        "resume with the checkpoint's trainer.devices x trainer.num_nodes and strategy, or start a "
                        "new run without trainer.resume_from", key="trainer.devices" if other_size else "strategy")


def saved_world(ckpt: Any) -> dict[str, Any] | None:
    """The world a checkpoint was written by: its ``spp_settings["world"]``, else (an older checkpoint) the world
    size its per-rank random states give, else ``None``."""
    from spp.training.callbacks.rng_state import RNG_KEY  # start-up time: Lightning only when resuming

    if not isinstance(ckpt, dict):
        return None
    world = (ckpt.get("spp_settings") or {}).get("world")
    if isinstance(world, dict) and "world_size" in world:
        return world
    states = ckpt.get(RNG_KEY)
    return {"world_size": len(states)} if isinstance(states, list) and states else None


def check_resume(job: Any, checkpoint: str | os.PathLike[str]) -> None:
    """Compare a resume checkpoint's ``spp_settings`` with the job; name every key that differs. The world size
    and strategy first (:func:`check_world`). Settings the checkpoint predates (written by an older version) are
    not compared: a warning names them."""
    state_file = check_resume_format(job.strategy, checkpoint)  # a DeepSpeed directory: the file of its client state
    with user_file(checkpoint, "trainer.resume_from"):
        ckpt = torch.load(state_file, map_location="cpu", weights_only=False, mmap=True)
    now = settings_of(job)
    check_world(checkpoint, saved_world(ckpt), now.pop("world"))
    saved = ckpt.get("spp_settings") if isinstance(ckpt, dict) else None
    if not saved:
        log.warning("preflight: %s holds no spp_settings (written before they were saved); not compared", checkpoint)
        return
    saved = {k: v for k, v in saved.items() if k != "world"}
    diffs, unsaved = compare_settings(saved, now)
    if diffs:
        raise UserError(f"trainer.resume_from={str(checkpoint)!r} was written with other settings: {', '.join(diffs)}",
                        "resume with the checkpoint's settings, or start a new run without trainer.resume_from",
                        key="trainer.resume_from")
    if unsaved:
        log.warning("preflight: %s was written before these settings were saved, so they are not compared: %s",
                    checkpoint, ", ".join(unsaved))
