"""What a finished job reports: ``summary.json`` built from the phases' typed results, and the closing table."""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from spp.eval.evaluate import Evaluation
from spp.eval.perplexity import gap_closed
from spp.eval.tables import few_windows_caveat
from spp.loggers import config_record
from spp.report_text import ppl_with_interval
from spp.training.callbacks.pruning import PrunedModel
from spp.training.finalize import FinalizeResult
from spp.training.phases import FitResult
from spp.training.run import Run

VERSIONED = ("spp", "torch", "lightning", "transformers", "peft", "hydra-core", "lm_eval", "datasets", "wandb")


def versions() -> dict[str, str]:
    """Installed versions of the packages a result depends on (plus Python)."""
    out = {"python": platform.python_version()}
    for pkg in VERSIONED:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _loss_summary(train: list[float], val: list[float], steps: int,
                  parts: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """The training objective's losses (``train``; its parts, e.g. ``ce``, in ``train_parts`` when it has any) and
    the validation cross-entropy (``val``)."""
    k = max(1, min(10, len(train) // 4))
    return {
        "train_first": sum(train[:k]) / k if train else None,
        "train_last": sum(train[-k:]) / k if train else None,
        "averaged_over": k,
        "train": train,
        "val": val,
        "optimizer_steps": steps,
        **({"train_parts": parts} if parts else {}),
    }


def _gap_closed(dense: dict[str, Any] | None, pruned: dict[str, Any] | None,
                merged: dict[str, Any] | None) -> dict[str, float] | None:
    """Fraction of the log-perplexity gap the adapter closes, with its paired 95 % bootstrap interval over
    windows (:func:`spp.eval.perplexity.gap_closed`); ``None`` without all three on the same windows."""
    if not (dense and pruned and merged):
        return None
    try:
        return gap_closed(dense, pruned, merged)
    except ValueError:
        return None


def build_summary(run: Run, ids: Mapping[str, Any], pruned: PrunedModel, fitted: FitResult, final: FinalizeResult,
                  timings: dict[str, float]) -> dict[str, Any]:
    """Everything a table or plot needs from this job (written to ``summary.json``): the pruning phase's
    :class:`~spp.training.callbacks.pruning.PruningRecord`, training's :class:`~spp.training.phases.TrainingRecord`
    and the finalize phase's result."""
    job, run_dir = run.job, run.run_dir
    kept = sum(int(m.sum()) for m in pruned.masks.values())
    total = sum(m.numel() for m in pruned.masks.values())
    ppl, trained, merged = pruned.record.ppl, fitted.record, final.evaluation or Evaluation()
    return {
        "run": {"name": ids["name"], "group": ids["group"], "tags": ids["tags"], "run_dir": str(run_dir),
                "model": job.model.name, "pruner": job.pruner.name, "sparsity": job.sparsity.name,
                "adapter": job.adapter.name, "r": getattr(job.adapter, "r", None), "objective": job.objective.name},
        "perplexity": {"dense": ppl.get("dense"), "pruned": ppl.get("pruned"),
                       **({"reconstructed": ppl["reconstructed"]} if ppl.get("reconstructed") else {}),
                       "merged": merged.ppl},
        "merged_ppl_by_source": merged.ppl_by_source,
        "gap_closed": _gap_closed(ppl.get("dense"), ppl.get("pruned"), merged.ppl),
        "gap_closed_by_reconstruction": _gap_closed(ppl.get("dense"), ppl.get("pruned"), ppl.get("reconstructed")),
        "reconstruction": (pruned.record.reconstruction.summary() if pruned.record.reconstruction is not None
                           else None),
        "zero_shot": merged.zero_shot,
        "sparsity": {
            "target": job.sparsity.target_ratio,
            "before": (total - kept) / total if total else 0.0,
            "after": final.audit.get("sparsity"),
            "audits": [*trained.audits, {"when": "merged", **final.audit}],
        },
        "params": trained.params.to_dict(),
        "memory": trained.memory,
        "samples": {"prompt": job.sample.prompt, **pruned.record.samples, "merged": merged.sample}
        if merged.sample else None,
        "recovery_curve": trained.recovery_curve,
        "losses": _loss_summary(trained.train_losses, trained.val_losses, trained.steps, trained.train_parts),
        "data": trained.data,
        "pruning": {"cache_hit": pruned.record.result.cache_hit, "timings": pruned.record.result.timings,
                    "report": pruned.record.result.report.overall},
        "merge": final.merge,
        "evaluation": merged.record() if final.evaluation is not None else {},
        "timings": timings,
        "outputs": {"merged_dir": final.merged_dir, "adapter_dir": final.adapter_dir,
                    "export_error": str(final.export_error) if final.export_error is not None else None,
                    "checkpoints": str(run_dir / "checkpoints"), "summary": str(run_dir / "summary.json"),
                    "resolved_config": str(run_dir / "resolved_config.yaml")},
        "config": config_record(job),
        "versions": versions(),
    }


def results_table(summary: dict[str, Any]) -> Table:
    """The closing table: perplexity dense → pruned → pruned+adapter, sparsity, params, time, output."""
    ppl = summary.get("perplexity", {})
    first = next((v for v in ppl.values() if v), None)
    where = f" ({first['source']}, seqlen {first['seqlen']}, {first['windows']} windows)" if first else ""
    table = Table(title=f"spp run: {summary['run']['name']}", show_header=True)
    table.add_column("quantity")
    table.add_column("value", overflow="fold")
    label = summary["run"]["adapter"]
    table.add_row(
        f"perplexity{where}",
        f"dense {ppl_with_interval(ppl.get('dense'))} → pruned {ppl_with_interval(ppl.get('pruned'))} → "
        + (f"reconstructed {ppl_with_interval(ppl['reconstructed'])} → " if ppl.get("reconstructed") else "")
        + f"pruned+{label} {ppl_with_interval(ppl.get('merged'))}",
    )
    main = ((summary.get("config") or {}).get("eval") or {}).get("ppl_source")
    for src, entry in (summary.get("merged_ppl_by_source") or {}).items():
        if entry and src != main:
            table.add_row(f"perplexity {src} ({entry['windows']} windows)",
                          f"pruned+{label} {ppl_with_interval(entry)}")
    sp = summary.get("sparsity", {})
    before, after = sp.get("before"), sp.get("after")
    table.add_row(
        "sparsity (adapted matrices)",
        f"before {before:.4f} → after {after:.4f}" if before is not None and after is not None else "-",
    )
    params = summary.get("params", {})
    if params:
        share = params["trainable"] / max(params["total"], 1)
        table.add_row("trainable parameters", f"{params['trainable']:,} of {params['total']:,} ({share:.3%})")
    losses = summary.get("losses", {})
    if losses.get("train_first") is not None:
        table.add_row("train loss", f"{losses['train_first']:.3f} → {losses['train_last']:.3f} "
                                    f"({losses['optimizer_steps']} optimizer steps)")
    timings = summary.get("timings", {})
    table.add_row("training time", f"{timings.get('train', 0):.1f} s (job total {timings.get('total', 0):.1f} s)")
    samples = summary.get("samples") or {}
    for stage in ("dense", "pruned", "merged"):
        if samples.get(stage):
            table.add_row(f"{stage} says ({samples['prompt']!r})", samples[stage]["completion"].strip())
    return table


def output_lines(summary: dict[str, Any]) -> list[str]:
    """One ``name: path`` line per output, printed under the table unwrapped so a path can be copied."""
    outputs = summary.get("outputs", {})
    names = (("merged model", "merged_dir"), ("adapter", "adapter_dir"), ("summary", "summary"),
             ("config", "resolved_config"))
    lines = [f"{label}: {outputs[key]}" for label, key in names if outputs.get(key)]
    lines += [f"data: {f['path']} (sha256 {f['sha256'][:12]}{', truncated sample' if f['truncated_sample'] else ''})"
              for f in summary.get("data_files") or []]
    if summary.get("status") == "export_failed":
        lines.append(f"status: export failed ({outputs.get('export_error')})")
    if summary.get("status") == "diverged":
        lines.append(f"status: diverged ({'; '.join(summary.get('diverged') or [])}); merged model not exported")
    return lines


def print_results(summary: dict[str, Any]) -> None:
    """Print :func:`results_table`, then :func:`output_lines` as plain text (never wrapped)."""
    Console().print(results_table(summary))
    ppl = summary.get("perplexity", {})
    with_ci = [entry for entry in ppl.values() if entry and entry.get("ci_low") is not None]
    if with_ci:
        fewest = min((int(e["windows"]) for e in with_ci if e.get("windows") is not None), default=None)
        print("perplexity [low, high]: 95 % bootstrap interval over the evaluation windows (summary.json: ci_low, "
              f"ci_high){few_windows_caveat(fewest)}")
    for line in output_lines(summary):
        print(line)
