"""The one-epoch methods study: pruned vs SPP vs SparsePEFT vs LoRA* vs masked full fine-tuning, from raw runs.

Use: ``python -m lab.methods_one_epoch experiments/results/runs/methods_one_epoch --out
experiments/results/methods_one_epoch_smollm2_135m.md`` (``--title`` / ``--command`` as for ``collect``). Reads every
``summary.json`` below the given directories except learning-rate grid runs (``lr_select/``), and writes:

1. one row per (sparsity, pruner, method) over its seeds: WikiText-2 perplexity with its 95 % bootstrap interval
   over windows (one seed) or mean ± sample std (several), fraction of the log-perplexity gap closed (paired
   interval / mean ± std), 7-task zero-shot mean with its standard error (lm-eval's per-task ``acc_stderr``),
   trainable parameters, seconds per optimizer step and logged training tokens/s, peak process memory;
2. every method against SPP on the same windows, seed by seed: the perplexity ratio with its paired bootstrap
   interval, and the zero-shot difference with ``sqrt(se_a² + se_b²)`` (the same documents, so conservative),
   each marked distinguishable only when its 95 % interval excludes zero.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import labels
from lab.collect_summaries import (
    Run,
    RunKey,
    cell,
    find_summaries,
    gap_cell,
    load_run,
    markdown_table,
    mean_cell,
    ppl_cell,
    protocol_notes,
    sparsity_label,
    sparsity_rank,
)
from lab.labels import method_labels, trained_from_summary
from spp.atomic import write_text_atomic
from spp.eval.harness import zero_shot_mean, zero_shot_mean_stderr
from spp.eval.perplexity import paired_difference

THROUGHPUT_COLUMN = "train/device/items_per_sec"
"""The training tokens/s ``train.py`` logs (Lightning's ``ThroughputMonitor``, one device)."""
Z95 = 1.959963984540054


@dataclass
class CampaignRun:
    """A collected run plus what the comparison needs beyond :class:`Run`: cost and the raw perplexities."""

    run: Run
    step_s: float | None
    tokens_per_s: float | None
    peak_gib: float | None
    perplexity: dict[str, Any]
    trained: int = 0


def logged_tokens_per_s(run_dir: Path) -> float | None:
    """Median of the logged training tokens/s in ``run_dir/csv/**/metrics.csv`` (``None`` when not logged)."""
    values: list[float] = []
    for path in sorted(run_dir.glob("csv/**/metrics.csv")):
        with path.open(newline="") as f:
            values += [float(row[THROUGHPUT_COLUMN]) for row in csv.DictReader(f) if row.get(THROUGHPUT_COLUMN)]
    return statistics.median(values) if values else None


def load_campaign_run(path: Path) -> CampaignRun:
    """Read one run: :func:`load_run` plus timings, memory, logged throughput and per-window perplexities."""
    data = json.loads(path.read_text())
    run = load_run(path)
    train_s = (data.get("timings") or {}).get("train")
    peak = (data.get("memory") or {}).get("peak_mib")
    return CampaignRun(
        run=run,
        step_s=train_s / run.steps if train_s and run.steps else None,
        tokens_per_s=logged_tokens_per_s(path.parent) if run.key.adapter != "none" else None,
        peak_gib=peak / 1024 if peak else None,
        perplexity=data["perplexity"],
        trained=trained_parameters(run, data),
    )


def trained_parameters(run: Run, data: dict[str, Any]) -> int:
    """Parameters that training can change, read from the run's summary (:func:`lab.labels.trained_from_summary`:
    the adapter's tensors, or for masked full fine-tuning the kept weights of the adapted projections)."""
    return trained_from_summary(run.key.adapter, data)


def load_campaign(roots: Iterable[str | Path]) -> list[CampaignRun]:
    """Every run below ``roots`` except learning-rate grid points (directories under ``lr_select``)."""
    return [load_campaign_run(p) for p in find_summaries(roots) if "lr_select" not in p.parts]


def _row_order(key: RunKey) -> tuple:
    """Sparsity, then pruner (Wanda first), then method in table order (a prompt-masked run after its method):
    each pruned model's block stays together."""
    return (sparsity_rank(key), key.pruner != "wanda", key.pruner,
            list(method_labels()).index(key.adapter) if key.adapter in method_labels() else 99, not key.train_on_inputs)


def group_campaign(runs: Sequence[CampaignRun]) -> dict[RunKey, list[CampaignRun]]:
    groups: dict[RunKey, list[CampaignRun]] = {}
    for r in sorted(runs, key=lambda r: r.run.seed):
        groups.setdefault(r.run.key, []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: _row_order(kv[0])))


def method_name(key: RunKey) -> str:
    """The campaign's Method column: ``SPP``, ``SPP (prompt masked)`` when the loss covered the response only, …
    (``collect.method_label`` is the paper tables' ``Wanda+SPP`` form)."""
    name = method_labels().get(key.adapter, key.adapter)
    return name if key.train_on_inputs else f"{name} (prompt masked)"


def pruner_label(key: RunKey) -> str:
    """The pruner's name in the tables (``Wanda``, ``SparseGPT``, …)."""
    return labels.pruner_label(key.pruner)


def model_label(key: RunKey) -> str:
    """Pruner and method, e.g. ``Wanda SPP (prompt masked)``: one model of a sparsity's block."""
    return f"{pruner_label(key)} {method_name(key)}"


def main_table(groups: dict[RunKey, list[CampaignRun]]) -> list[str]:
    """One row per (sparsity, pruner, method): quality with its uncertainty, then cost."""
    head = ["Sparsity", "Pruner", "Method", "lr (val.)", "Seeds", "PPL", "Gap closed (%)", "7-task mean (%)",
            "Trainable", "s / step", "tokens / s", "Peak RSS (GiB)"]
    rows = []
    dense = next((g[0].perplexity.get("dense") for g in groups.values() if g[0].perplexity.get("dense")), None)
    if dense:
        interval = f" [{dense['ci_low']:.2f}, {dense['ci_high']:.2f}]" if dense.get("ci_low") is not None else ""
        rows.append(["Dense", "–", "dense", "–", "–", f"{dense['ppl']:.2f}{interval}", "–", "–", "–", "–", "–", "–"])
    for key, group in groups.items():
        runs = [g.run for g in group]
        trained = key.adapter != "none"
        rows.append([
            sparsity_label(key), pruner_label(key), method_name(key),
            f"{key.lr:g}" if trained else "–", ",".join(str(r.seed) for r in runs),
            ppl_cell(runs, "merged" if trained else "pruned"), gap_cell(runs), mean_cell(runs),
            f"{group[0].trained:,}" if trained else "–",
            cell([g.step_s for g in group], digits=1) if trained else "–",
            cell([g.tokens_per_s for g in group], digits=0) if trained else "–",
            cell([g.peak_gib for g in group], digits=2),
        ])
    return markdown_table(head, rows, 3)


def _zero_shot_diff(a: Run, b: Run) -> tuple[float, float] | None:
    ma, mb = zero_shot_mean(a.tasks), zero_shot_mean(b.tasks)
    sa, sb = zero_shot_mean_stderr(a.tasks), zero_shot_mean_stderr(b.tasks)
    if None in (ma, mb, sa, sb):
        return None
    return ma - mb, math.sqrt(sa * sa + sb * sb)


def _verdict(low: float, high: float, lower_is_better: bool) -> str:
    if low <= 0.0 <= high:
        return "not distinguishable"
    spp_better = (low > 0) if lower_is_better else (high < 0)
    return "SPP better" if spp_better else "SPP worse"


def paired_table(groups: dict[RunKey, list[CampaignRun]]) -> list[str]:
    """Every other method against SPP at the same sparsity, pruner and seed, on the same windows and documents
    (SPP with the prompt masked out of the loss against SPP with the whole sequence in it)."""
    def is_reference(k: RunKey) -> bool:
        return k.adapter == "spp" and k.train_on_inputs

    def pruned_model(k: RunKey, seed: int) -> tuple:
        return k.sparsity_kind, k.ratio, k.n, k.m, k.pruner, seed

    spp = {pruned_model(k, r.run.seed): r for k, g in groups.items() if is_reference(k) for r in g}
    head = ["Sparsity", "Method vs SPP", "Seed", "PPL ratio (method / SPP) [95 %]", "PPL",
            "Δ 7-task mean (pts) ± 1.96 se", "Zero-shot"]
    rows = []
    for key, group in groups.items():
        if is_reference(key):
            continue
        for r in group:
            ref = spp.get(pruned_model(key, r.run.seed))
            if ref is None:
                continue
            which = "merged" if key.adapter != "none" else "pruned"
            d = paired_difference(r.perplexity[which], ref.perplexity["merged"])
            ratio = f"{d['ppl_ratio']:.3f} [{d['ppl_ratio_low']:.3f}, {d['ppl_ratio_high']:.3f}]"
            zs = _zero_shot_diff(r.run, ref.run)
            zs_text = f"{100 * zs[0]:+.2f} ± {100 * Z95 * zs[1]:.2f}" if zs else "–"
            zs_verdict = _verdict(zs[0] - Z95 * zs[1], zs[0] + Z95 * zs[1], False) if zs else "–"
            rows.append([sparsity_label(key), model_label(key),
                         str(r.run.seed), ratio, _verdict(d["log_ppl_diff_low"], d["log_ppl_diff_high"], True),
                         zs_text, zs_verdict])
    return markdown_table(head, rows, 3)


def collect_campaign(roots: Iterable[str | Path], title: str | None = None, command: str | None = None) -> str:
    """The Markdown report over every (non-grid) ``summary.json`` below ``roots``."""
    runs = load_campaign(roots)
    groups = group_campaign(runs)
    default = "Methods after one epoch: sparsity-preserving fine-tuning methods compared on SmolLM2-135M"
    parts = [f"# {title or default}", ""]
    if command:
        parts += [f"Command: `{command}`", ""]
    parts += main_table(groups) + [""]
    parts += ["Each method against SPP (same pruned model, seed, windows and documents):", ""]
    parts += paired_table(groups) + [""]
    parts += [
        "PPL = WikiText-2 test perplexity of the final model (merged / re-masked; the pruned model for `pruned`): "
        "one seed -> `ppl [95 % percentile-bootstrap interval over windows]`, several -> mean ± sample std over "
        "seeds. Gap closed = (log PPL pruned − log PPL) / (log PPL pruned − log PPL dense) with its paired "
        "bootstrap interval. 7-task mean = mean lm-eval `acc` of BoolQ, RTE, HellaSwag, WinoGrande, ARC-e, ARC-c, "
        "OBQA with `(se ...)` from the per-task `acc_stderr`. lr (val.) = the learning rate chosen on the Alpaca "
        "validation loss (`python -m lab.lr_select`). Trainable = parameters training can change (masked "
        "full FT: the kept weights of the adapted projections). s / step = training seconds (validation passes "
        "included) / optimizer steps; tokens / s = median of the logged `train/device/items_per_sec`; Peak RSS = "
        "the process's maximum resident memory (model load included). Paired rows: a verdict names a difference "
        "only when its 95 % interval excludes zero (PPL: paired bootstrap over windows; zero-shot: ±1.96 × "
        "sqrt(se_a² + se_b²)).",
        "",
        "Budgets:",
        *protocol_notes([r.run for r in runs]),
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="campaign directories (searched recursively for summary.json)")
    parser.add_argument("--out", help="Markdown file to write (atomically)")
    parser.add_argument("--title", help="title line")
    parser.add_argument("--command", help="command line quoted under the title")
    args = parser.parse_args(argv)
    try:
        report = collect_campaign(args.runs, title=args.title, command=args.command)
    except (FileNotFoundError, ValueError) as err:
        print(f"methods_one_epoch: {err}", file=sys.stderr)
        return 2
    if args.out:
        write_text_atomic(Path(args.out), report)
    sys.stdout.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
