"""What ``prune.py`` does: load a model, prune it (through the cache) on one or N Fabric ranks, audit, save it.

Every rank runs its share of the calibration batches; global rank 0 holds the weights and writes the outputs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from spp.atomic import write_dir_atomic, write_json_atomic, write_text_atomic
from spp.distributed import launch_processes
from spp.models.loading import load_for_rank, load_tokenizer
from spp.projections import find_projections
from spp.pruning.cache import READ_MARGIN_S
from spp.pruning.config import PruneJobConfig
from spp.pruning.patterns import sparsity_summary
from spp.pruning.reconstruction.phase import get_or_reconstruct


def prune_job(job: PruneJobConfig, output_dir: Path, methods: Any = None) -> dict[str, Any] | None:
    """Load, prune (through the cache unless ``use_cache=false``), reconstruct when asked, audit and save.
    Returns the timing record on rank 0 (``None`` elsewhere)."""
    ctx = launch_processes(job.accelerator, job.devices, job.num_nodes, job.device)
    ctx.allow_long_waits(job.cache_lock_timeout_s + READ_MARGIN_S)  # the others wait while rank 0 loads alone
    t_start = time.perf_counter()
    torch.manual_seed(job.seed)
    model, tokenizer = load_for_rank(job.model, ctx.rank), load_tokenizer(job.model)
    timing: dict[str, Any] = {"load_model": time.perf_counter() - t_start, "ranks": ctx.world}
    method, form = (methods.pruner, methods.form) if methods is not None else (None, None)
    result, reconstruction = get_or_reconstruct(
        model, tokenizer, job.model, job.pruner, job.sparsity, job.calibration, job.reconstruct,
        job.cache_dir if job.use_cache else None, job.data_dir, ctx=ctx, lock_timeout_s=job.cache_lock_timeout_s,
        method=method, form=form)
    if not ctx.is_main:
        return None
    timing.update(prune=result.timings, cache_hit=result.cache_hit, cache_path=result.cache_path)
    if reconstruction is not None:
        timing["reconstruct"] = reconstruction.timings
        write_json_atomic(output_dir / "reconstruction.json", reconstruction.summary())
    linears = find_projections(model, job.pruner.targets, "pruner.targets")
    summary = sparsity_summary({n: m.weight for n, m in linears.items()}, *job.sparsity.nm_pair)
    summary.update(
        model=job.model.name, pruner=job.pruner.name, sparsity=job.sparsity.name,
        target_ratio=job.sparsity.target_ratio,
        calibration=OmegaConf.to_container(OmegaConf.structured(job.calibration)),
        calibration_draw=result.report.overall.get("calibration"),  # distinct documents / stream coverage
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
    if reconstruction is not None:
        record = reconstruction.summary()
        print(f"reconstruction ({job.reconstruct.form}): {len(record['blocks'])} blocks, mean "
              f"{job.reconstruct.loss.value} {record['loss_start_mean']:.4g} -> {record['loss_end_mean']:.4g}; cache "
              f"{'hit' if reconstruction.cache_hit else 'miss'}; per block: {output_dir / 'reconstruction.json'}")
    return timing
