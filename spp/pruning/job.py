"""What ``prune.py`` does: load a model, prune it (through the cache), audit the zeros and save it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from spp.atomic import write_dir_atomic, write_json_atomic, write_text_atomic
from spp.models.loading import load_model
from spp.pruning.cache import get_or_prune
from spp.pruning.config import PruneJobConfig
from spp.pruning.engine import prune_model
from spp.pruning.patterns import sparsity_summary
from spp.pruning.targets import target_linears


def run(job: PruneJobConfig, output_dir: Path) -> dict[str, Any]:
    """Load, prune (through the cache unless ``use_cache=false``), audit and save; returns the timing record.

    Writes ``mask_summary.json`` (per-layer and overall exact-zero sparsity, N:M audit), ``report.md``,
    ``timing.json`` (with ``cache_hit``) and, with ``save_model``, ``model/`` (``save_pretrained`` + tokenizer).
    """
    t_start = time.perf_counter()
    torch.manual_seed(job.seed)
    model, tokenizer = load_model(job.model)
    timing: dict[str, Any] = {"load_model": time.perf_counter() - t_start}
    if job.use_cache:
        result = get_or_prune(
            model, tokenizer, job.model, job.pruner, job.sparsity, job.calibration, job.cache_dir, job.data_dir,
            job.device,
        )
    else:
        result = prune_model(model, tokenizer, job.pruner, job.sparsity, job.calibration, job.data_dir, job.device)
    timing.update(prune=result.timings, cache_hit=result.cache_hit, cache_path=result.cache_path)
    nm = (job.sparsity.n, job.sparsity.m) if job.sparsity.kind == "nm" else (None, None)
    summary = sparsity_summary({n: m.weight for n, m in target_linears(model, job.pruner.targets).items()}, *nm)
    summary.update(
        model=job.model.name, pruner=job.pruner.name, sparsity=job.sparsity.name,
        target_ratio=job.sparsity.target_ratio,
        calibration=OmegaConf.to_container(OmegaConf.structured(job.calibration)),
    )
    write_json_atomic(output_dir / "mask_summary.json", summary)
    write_text_atomic(output_dir / "report.md", result.report.to_markdown() + "\n")
    if job.save_model:
        t0 = time.perf_counter()

        def save(tmp: Path) -> None:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)

        write_dir_atomic(output_dir / "model", save)
        timing["save_model"] = time.perf_counter() - t0
    timing["total"] = time.perf_counter() - t_start
    write_json_atomic(output_dir / "timing.json", timing)
    print(result.report.to_markdown().splitlines()[-1])
    print(f"overall sparsity {summary['overall']['sparsity']:.4f} (target {job.sparsity.target_ratio:.4f}); "
          f"cache {'hit' if result.cache_hit else 'miss'}; outputs in {output_dir}")
    return timing
