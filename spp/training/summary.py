"""The job's ``summary.json``, the closing Rich table, and the resolved config as a Rich tree."""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from spp.atomic import write_json_atomic, write_text_atomic

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


def config_tree(cfg: DictConfig) -> Tree:
    """The resolved config as a Rich tree (one branch per group)."""
    tree = Tree("[bold]config[/bold]")
    for key, value in cfg.items():
        branch = tree.add(f"[bold cyan]{key}[/bold cyan]")
        if isinstance(value, DictConfig):
            branch.add(OmegaConf.to_yaml(value, resolve=True).rstrip() or "{}")
        else:
            branch.add(str(value))
    return tree


def save_and_print_config(cfg: DictConfig, run_dir: Path, show: bool = True) -> None:
    """Print the resolved config as a Rich tree and save it as ``resolved_config.yaml`` in ``run_dir``."""
    write_text_atomic(run_dir / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    if show:
        Console().print(config_tree(cfg))


def _fmt_ppl(entry: dict[str, Any] | None) -> str:
    return f"{entry['ppl']:.2f}" if entry else "-"


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
        f"dense {_fmt_ppl(ppl.get('dense'))} → pruned {_fmt_ppl(ppl.get('pruned'))} → "
        f"pruned+{label} {_fmt_ppl(ppl.get('merged'))}",
    )
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
    table.add_row("merged model", summary.get("outputs", {}).get("merged_dir") or "-")
    return table


def write_summary(run_dir: Path, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` atomically."""
    return write_json_atomic(run_dir / "summary.json", summary)


def print_results(summary: dict[str, Any]) -> None:
    """Print :func:`results_table`."""
    Console().print(results_table(summary))
