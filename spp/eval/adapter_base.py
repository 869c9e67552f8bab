"""``eval.py adapter_dir=``: the base the job builds must be the one the adapter folder records, checked before any
weight is read (model identity in the recorded dtype, pruning cache key); zero patterns are checked after loading."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from spp.adapters.registry import trained_on
from spp.adapters.trained_on import base_refusal
from spp.eval.job_config import EvalJobConfig
from spp.models.loading import model_identity, resolve_source
from spp.pruning.cache import cache_key
from spp.pruning.reconstruction.cache import reconstruct_key
from spp.report_text import dotted_keys

IGNORED = ("code_version", "model")
"""Cache-key fields not compared here: the code version (the zero pattern decides) and the model (compared apart)."""
ORDER = ("pruner", "sparsity", "calibration")
"""The order differences are named in."""


def key_differences(trained: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """``calibration.nsamples=128 when trained, 4 here`` for each differing field of two pruning cache keys, pruner
    first, then pattern and calibration (a section only one side has: ``calibration`` once)."""
    sections = sorted((set(trained) | set(here)) - set(IGNORED), key=lambda k: (ORDER.index(k) if k in ORDER else 9, k))
    out = []
    for section in sections:
        if (section in trained) != (section in here):
            out.append(f"{section} {'recorded when trained, none here' if section in trained else 'none when trained'}")
            continue
        a, b = dotted_keys(trained[section], section), dotted_keys(here[section], section)
        out += [f"{k}={a.get(k)!r} when trained, {b.get(k)!r} here" for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)]
    return out


def base_differences(cfg: EvalJobConfig, record: dict[str, Any], prunes: bool) -> list[str]:
    """How the base ``cfg`` builds differs from ``record`` (empty: the same model and pruning)."""
    model = record.get("model") or {}
    model_cfg = dataclasses.replace(cfg.model, torch_dtype=model.get("dtype") or cfg.model.torch_dtype)
    differences = []
    identity = model_identity(model_cfg)
    if identity != model.get("identity"):
        differences.append(f"model={model.get('name')} ({model.get('identity')}) when trained, {cfg.model.name} "
                           f"({identity}) here")
    pruning = record.get("pruning")
    if prunes and pruning is None:
        differences.append(f"a dense base when trained, pruned here ({cfg.pruner.name} {cfg.sparsity.name})")
    elif not prunes and pruning is not None:
        differences.append(f"pruned {pruning.get('pruner')} {pruning.get('sparsity')} when trained, dense here")
    elif prunes:
        key, digest = cache_key(model_cfg, cfg.pruner, cfg.sparsity, cfg.calibration, cfg.data_dir)
        differences += key_differences(pruning.get("key") or {}, json.loads(json.dumps(key)))  # as recorded
        differences += reconstruction_differences(cfg, record.get("reconstruction"), key, digest)
    return differences


def reconstruction_differences(cfg: EvalJobConfig, recorded: dict[str, Any] | None, pruning_key: dict[str, Any],
                               pruning_digest: str) -> list[str]:
    """How the reconstruction ``cfg`` runs differs from the recorded one (the same zeros, other weights)."""
    if not recorded:
        return ["reconstruct=blockwise here, none when trained"] if cfg.reconstruct.enabled else []
    if not cfg.reconstruct.enabled:
        return ["reconstructed block by block when trained (reconstruct=blockwise), not here"]
    key, _ = reconstruct_key(pruning_key, pruning_digest, cfg.reconstruct, cfg.data_dir)
    trained, here = recorded.get("key") or {}, json.loads(json.dumps(key, default=str))
    return [f"reconstruct.{k}={trained.get('reconstruct', {}).get(k)!r} when trained, "
            f"{here['reconstruct'].get(k)!r} here" for k in sorted(here["reconstruct"])
            if trained.get("reconstruct", {}).get(k) != here["reconstruct"].get(k)] or (
        ["the reconstruction's calibration file or form options differ"] if trained != here else [])


def check_adapter_base(cfg: EvalJobConfig, prunes: bool) -> None:
    """Refuse, before any model is loaded, an ``adapter_dir=`` recorded on another model or pruning than ``cfg``'s.

    A folder without the record, or a saved model evaluated as it is, has nothing to compare (its zero pattern is
    checked after loading)."""
    record = trained_on(cfg.adapter_dir) if cfg.adapter_dir else None
    if not record:
        return
    if not prunes and resolve_source(cfg.model)[0] == "dir":
        return
    differences = base_differences(cfg, record, prunes)
    if differences:
        raise base_refusal(f"adapter_dir={cfg.adapter_dir!r}", record, "; ".join(differences[:3]), path=cfg.adapter_dir)
