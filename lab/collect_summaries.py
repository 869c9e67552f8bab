"""Collect the ``summary.json`` files of a sweep into the paper-shaped Markdown table of one paper table.

Use: ``python -m lab.collect_summaries table6 <sweep dir> --out experiments/results/table6_ablations.md``
(or ``python experiments/collect_summaries.py ...``).

Every ``summary.json`` below the given directories (any depth, as Hydra multirun writes them) is one run. Runs
that differ only in ``seed`` are one row: the cell is the mean, with ``± std`` (sample standard deviation) when
there are several seeds. Table ids: ``table2`` (zero-shot, Tables 2/8), ``table3`` (75 %: pruned, DS⊘T, SPP),
``table4`` (LoRA* vs SPP), ``table5`` (MMLU 5-shot, one column per model), ``table6`` (ablations of r, beta,
initialisation and the residual form, Tables 6/7).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.labels import pruner_rank, pruner_row_label, pruner_variant
from spp.atomic import write_text_atomic
from spp.eval.harness import zero_shot_mean, zero_shot_mean_stderr
from spp.eval.tables import PAPER_COLUMNS
from spp.eval.task_table import MMLU_GROUP
from spp.report_text import markdown_lines as markdown_table

TABLE_IDS = ("table2", "table3", "table4", "table5", "table6")


ADAPTER_SUFFIX = {"none": "", "spp": "+SPP", "lora": "+LoRA*"}
ADAPTER_RANK = {"none": 0, "lora": 1, "spp": 2}
SPP_DEFAULT = {"use_beta": True, "alpha_init": "kaiming", "beta_init": "zeros", "residual": True}


@dataclass(frozen=True)
class RunKey:
    """What identifies a table row: every setting of a run except its seed."""

    model: str
    pruner: str
    initial: str | None
    sparsity_kind: str
    ratio: float
    n: int | None
    m: int | None
    adapter: str
    r: int
    use_beta: bool
    alpha_init: str
    beta_init: str
    residual: bool
    lr: float = 0.0
    train_on_inputs: bool = True
    """``data.train_on_inputs``: ``False`` when the prompt was masked out of the loss."""


@dataclass
class Run:
    """The numbers one ``summary.json`` holds that the tables use."""

    key: RunKey
    seed: int
    total_params: int
    ppl_pruned: float | None
    ppl_merged: float | None
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)
    removed_fraction: float | None = None
    ppl_dense: float | None = None
    trainable: int = 0
    train_last: float | None = None
    steps: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    ppl_entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    gap: dict[str, float] | None = None


def _ppl(entry: dict[str, Any] | None) -> float | None:
    return float(entry["ppl"]) if entry else None


def load_run(path: Path) -> Run:
    """Read one ``summary.json`` written by ``train.py``.

    Raises:
        ValueError: the file is not a training summary (names the missing key).
    """
    data = json.loads(path.read_text())
    for key in ("run", "config", "perplexity"):
        if key not in data:
            raise ValueError(f"{path} is not a train.py summary.json (no {key!r} key)")
    cfg = data["config"]
    sp, ad, pr = cfg["sparsity"], cfg["adapter"], cfg["pruner"]
    ratio = sp.get("ratio")
    if sp["kind"] == "nm":
        ratio = 1.0 - sp["n"] / sp["m"]
    key = RunKey(
        model=cfg["model"]["name"],
        pruner=pr["name"],
        initial=pruner_variant(pr),
        sparsity_kind=sp["kind"],
        ratio=float(ratio or 0.0),
        n=sp.get("n"),
        m=sp.get("m"),
        adapter=ad["name"],
        r=int(ad.get("r") or 0) if ad["name"] != "none" else 0,
        use_beta=bool(ad.get("use_beta", True)) if ad["name"] == "spp" else True,
        alpha_init=ad.get("alpha_init", "kaiming") if ad["name"] == "spp" else "kaiming",
        beta_init=ad.get("beta_init", "zeros") if ad["name"] == "spp" else "zeros",
        residual=bool(ad.get("residual", True)) if ad["name"] == "spp" else True,
        lr=float(cfg.get("trainer", {}).get("lr", 0.0)) if ad["name"] != "none" else 0.0,
        train_on_inputs=bool((cfg.get("data") or {}).get("train_on_inputs", True)) if ad["name"] != "none" else True,
    )
    zero_shot = data.get("zero_shot") or {}
    losses = data.get("losses") or {}
    params = data.get("params") or {}
    return Run(
        key=key,
        seed=int(cfg.get("seed", 0)),
        total_params=int(params.get("total", 0)),
        ppl_pruned=_ppl(data["perplexity"].get("pruned")),
        ppl_merged=_ppl(data["perplexity"].get("merged")),
        tasks=zero_shot.get("metrics") or {},
        removed_fraction=(data.get("merge") or {}).get("removed_fraction"),
        ppl_dense=_ppl(data["perplexity"].get("dense")),
        trainable=int(params.get("trainable", 0)),
        train_last=losses.get("train_last"),
        steps=int(losses.get("optimizer_steps") or 0),
        config=cfg,
        ppl_entries={k: v for k, v in data["perplexity"].items() if v},
        gap=data.get("gap_closed"),
    )


def find_summaries(roots: Iterable[str | Path]) -> list[Path]:
    """Every ``summary.json`` below ``roots`` (sorted).

    Raises:
        FileNotFoundError: a root that does not exist, or roots holding no ``summary.json`` at all.
    """
    found: list[Path] = []
    for root in map(Path, roots):
        if not root.exists():
            raise FileNotFoundError(f"runs directory {root} does not exist (pass the multirun sweep directory)")
        found += [root] if root.is_file() else sorted(root.rglob("summary.json"))
    if not found:
        raise FileNotFoundError(f"no summary.json under {[str(r) for r in roots]}; did the sweep finish?")
    return sorted(set(found))


def method_label(key: RunKey) -> str:
    """``Wanda``, ``Wanda+DS⊘T``, ``Wanda+SPP``, ``Wanda+LoRA*``, ``None`` (dense) as in the paper."""
    return pruner_row_label(key.pruner, key.initial) + ADAPTER_SUFFIX.get(key.adapter, f"+{key.adapter}")


def sparsity_label(key: RunKey) -> str:
    """``Dense``, ``Unstructured 50%``, ``2:4`` (N:M = N kept of every M)."""
    if key.sparsity_kind == "dense":
        return "Dense"
    if key.sparsity_kind == "nm":
        return f"{key.n}:{key.m}"
    return f"Unstructured {100 * key.ratio:g}%"


def is_spp_default(key: RunKey) -> bool:
    """Whether the run's SPP settings (β, initialisation, residual) are the paper's defaults (any r, any lr)."""
    return all(getattr(key, f) == v for f, v in SPP_DEFAULT.items())


def sparsity_rank(key: RunKey) -> tuple:
    """Sort key: dense first, then by ratio, unstructured before N:M of the same ratio."""
    return (key.sparsity_kind != "dense", key.ratio, key.sparsity_kind == "nm", key.n or 0, key.m or 0)


def group_runs(runs: Sequence[Run]) -> dict[RunKey, list[Run]]:
    """Runs grouped by everything but the seed (seeds ascending inside a group)."""
    groups: dict[RunKey, list[Run]] = {}
    for run in sorted(runs, key=lambda r: r.seed):
        groups.setdefault(run.key, []).append(run)
    return groups


def cell(values: Sequence[float | None], scale: float = 1.0, digits: int = 2) -> str:
    """Mean of the non-missing values (× ``scale``), with ``± sample std`` when there are several; ``–`` if none."""
    vals = [scale * v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "–"
    mean = sum(vals) / len(vals)
    if len(vals) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def gap_fraction(run: Run) -> float | None:
    """Fraction of the log-perplexity gap closed, ``(log ppl_pruned - log ppl_merged) / (log ppl_pruned -
    log ppl_dense)``: from ``summary.json`` when recorded, else from the three perplexities."""
    if run.gap:
        return run.gap["gap_closed"]
    if run.key.adapter == "none" or None in (run.ppl_dense, run.ppl_pruned, run.ppl_merged):
        return None
    gap = math.log(run.ppl_pruned) - math.log(run.ppl_dense)
    return (math.log(run.ppl_pruned) - math.log(run.ppl_merged)) / gap if gap > 0 else None


def ppl_cell(group: Sequence[Run], which: str = "merged") -> str:
    """Perplexity cell: one run with a recorded 95 % bootstrap interval -> ``ppl [low, high]``; else :func:`cell`."""
    entry = group[0].ppl_entries.get(which) if len(group) == 1 else None
    if entry and entry.get("ci_low") is not None:
        return f"{entry['ppl']:.2f} [{entry['ci_low']:.2f}, {entry['ci_high']:.2f}]"
    return cell([_ppl(r.ppl_entries.get(which)) for r in group])


def gap_cell(group: Sequence[Run]) -> str:
    """Gap closed (%): one run with a paired bootstrap interval -> ``x [low, high]``; else :func:`cell`."""
    if group[0].key.adapter == "none":
        return "–"
    gap = group[0].gap if len(group) == 1 else None
    if gap and gap.get("gap_closed_low") is not None:
        return f"{100 * gap['gap_closed']:.1f} [{100 * gap['gap_closed_low']:.1f}, {100 * gap['gap_closed_high']:.1f}]"
    return cell([gap_fraction(r) for r in group], 100, 1)


def mean_cell(group: Sequence[Run]) -> str:
    """7-task mean (%): one run -> ``mean (se x)`` from lm-eval's per-task standard errors; seeds of which only
    one has zero-shot results -> the same, naming that seed; several -> :func:`cell` (mean ± std over seeds)."""
    scored = [r for r in group if r.tasks]
    if len(scored) == 1:
        mean, se = zero_shot_mean(scored[0].tasks), zero_shot_mean_stderr(scored[0].tasks)
        if mean is not None and se is not None:
            seed = f"; seed {scored[0].seed}" if len(group) > 1 else ""
            return f"{100 * mean:.2f} (se {100 * se:.2f}{seed})"
    return cell([_mean(r) for r in group], 100)


def _acc(run: Run, task: str) -> float | None:
    return run.tasks.get(task, {}).get("acc")


def _mean(run: Run) -> float | None:
    return zero_shot_mean(run.tasks) if run.tasks else None


def _seeds(group: Sequence[Run]) -> str:
    return ",".join(str(r.seed) for r in group)


def _model_order(groups: dict[RunKey, list[Run]]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for key, group in groups.items():
        sizes[key.model] = max(sizes.get(key.model, 0), group[0].total_params - group[0].trainable)
    return {m: i for i, m in enumerate(sorted(sizes, key=lambda m: (sizes[m], m)))}


def table_zero_shot(groups: dict[RunKey, list[Run]]) -> list[str]:
    """Tables 2/8: per-task zero-shot ``acc`` (%), the 7-task Average, and WikiText-2 perplexity."""
    order = _model_order(groups)
    keys = sorted(groups, key=lambda k: (order[k.model], k.sparsity_kind != "dense", pruner_rank(k.pruner),
                                         sparsity_rank(k), ADAPTER_RANK.get(k.adapter, 9), k.r))
    head = ["Model", "Method", "Sparsity", *(t for _, t in PAPER_COLUMNS), "Average", "PPL", "Gap closed (%)",
            "Seeds"]
    rows = []
    for k in keys:
        g = groups[k]
        accs = [cell([_acc(r, task) for r in g], 100) for task, _ in PAPER_COLUMNS]
        rows.append([k.model, method_label(k), sparsity_label(k), *accs, mean_cell(g), ppl_cell(g), gap_cell(g),
                     _seeds(g)])
    return markdown_table(head, rows, 3)


def table_high_sparsity(groups: dict[RunKey, list[Run]]) -> list[str]:
    """Table 3: at 75 % (unstructured75, 2:8): Wanda vs Wanda+DS⊘T vs Wanda+SPP, LM-eval mean and perplexity."""
    order = _model_order(groups)
    keys = sorted(groups, key=lambda k: (order[k.model], sparsity_rank(k), ADAPTER_RANK.get(k.adapter, 9),
                                         pruner_rank(k.pruner), k.r))
    head = ["Model", "Method", "Sparsity", "LM-eval", "PPL (↓)", "Gap closed (%)", "Seeds"]
    rows = [[k.model, method_label(k), sparsity_label(k), mean_cell(groups[k]), ppl_cell(groups[k]),
             gap_cell(groups[k]), _seeds(groups[k])] for k in keys]
    return markdown_table(head, rows, 3)


def table_lora_star(groups: dict[RunKey, list[Run]]) -> list[str]:
    """Table 4: LoRA* (LoRA merged then re-masked) vs SPP: zero-shot, perplexity, share of the update re-masked."""
    order = _model_order(groups)
    keys = sorted(groups, key=lambda k: (order[k.model], sparsity_rank(k), ADAPTER_RANK.get(k.adapter, 9),
                                         pruner_rank(k.pruner), k.r, -k.lr))
    head = ["Model", "Method", "Sparsity", "r", "lr", *(t for _, t in PAPER_COLUMNS), "Average", "PPL",
            "Gap closed (%)", "Train loss (last)", "Trainable", "Update removed by re-mask (%)", "Seeds"]
    rows = []
    for k in keys:
        g = groups[k]
        trained = k.adapter != "none"
        accs = [cell([_acc(r, task) for r in g], 100) for task, _ in PAPER_COLUMNS]
        removed = cell([r.removed_fraction for r in g], 100) if k.adapter == "lora" else "0 (by construction)"
        rows.append([k.model, method_label(k), sparsity_label(k), str(k.r) if trained else "–",
                     f"{k.lr:g}" if trained else "–", *accs, mean_cell(g), ppl_cell(g), gap_cell(g),
                     cell([r.train_last for r in g], digits=3) if trained else "–",
                     f"{g[0].trainable:,}", removed, _seeds(g)])
    return markdown_table(head, rows, 3)


def table_mmlu(groups: dict[RunKey, list[Run]]) -> list[str]:
    """Table 5: MMLU 5-shot ``acc`` (%): rows = method × sparsity, one column per model (smallest first)."""
    order = _model_order(groups)
    models = sorted(order, key=order.get)
    rows_keys: dict[tuple, dict[str, list[Run]]] = {}
    for k, g in groups.items():
        row = (k.sparsity_kind != "dense", pruner_rank(k.pruner), sparsity_rank(k),
               ADAPTER_RANK.get(k.adapter, 9), k.r, method_label(k), sparsity_label(k))
        rows_keys.setdefault(row, {})[k.model] = g
    head = ["Method", "Sparsity", *models]
    rows = []
    for row in sorted(rows_keys):
        per_model = rows_keys[row]
        vals = [cell([r.tasks.get(MMLU_GROUP, {}).get("acc") for r in per_model.get(m, [])], 100) for m in models]
        rows.append([row[-2], row[-1], *vals])
    return markdown_table(head, rows, 2)


def _zero_init(k: RunKey) -> str:
    if not k.residual:
        return "none (α=β=1, no residual)"
    zeros = [name for name, init in (("α", k.alpha_init), ("β", k.beta_init if k.use_beta else "")) if init == "zeros"]
    return ", ".join(zeros) or "none"


def table_ablation(groups: dict[RunKey, list[Run]]) -> list[str]:
    """Tables 6/7: r, with/without beta, zero-init of alpha / beta / neither, residual form; LM-eval and PPL."""
    order = _model_order(groups)

    keys = sorted(groups, key=lambda k: (order[k.model], pruner_rank(k.pruner), sparsity_rank(k),
                                         ADAPTER_RANK.get(k.adapter, 9), k.r, is_spp_default(k),
                                         _zero_init(k), not k.use_beta))
    head = ["Model", "Method", "Sparsity", "Zero-init", "W_β", "r", "Residual", "LM-eval", "PPL pruned", "PPL",
            "Gap closed (%)", "Train loss (last)", "Trainable", "Seeds"]
    rows = []
    for k in keys:
        g = groups[k]
        spp = k.adapter == "spp"
        rows.append([
            k.model, method_label(k), sparsity_label(k), _zero_init(k) if spp else "–",
            ("✓" if k.use_beta else "✗") if spp else "–", str(k.r) if k.adapter != "none" else "–",
            ("yes" if k.residual else "no") if spp else "–", mean_cell(g),
            ppl_cell(g, "pruned"), ppl_cell(g), gap_cell(g), cell([r.train_last for r in g], 1, 3),
            f"{g[0].trainable:,}", _seeds(g),
        ])
    return markdown_table(head, rows, 3)


TABLES: dict[str, tuple[str, Callable[[dict[RunKey, list[Run]]], list[str]]]] = {
    "table2": ("Table 2/8: zero-shot accuracy (%), pruned vs pruned+SPP", table_zero_shot),
    "table3": ("Table 3: 75 % sparsity, Wanda vs Wanda+DS⊘T vs Wanda+SPP", table_high_sparsity),
    "table4": ("Table 4: LoRA* (merged, re-masked) vs SPP", table_lora_star),
    "table5": ("Table 5: MMLU 5-shot accuracy (%)", table_mmlu),
    "table6": ("Tables 6/7: ablations of r, W_β, zero-initialisation and the residual form", table_ablation),
}


def protocol_notes(runs: Sequence[Run]) -> list[str]:
    """One line per distinct budget: training examples / tokens / steps, eval windows, task limit, calibration."""
    seen: dict[str, None] = {}
    for run in runs:
        c = run.config
        ev, data, cal = c.get("eval", {}), c.get("data", {}), c.get("calibration", {})
        trained = "no training" if run.key.adapter == "none" else (
            f"train {data.get('max_examples') or 'all'} Alpaca records ≤ {data.get('max_length')} tokens, "
            f"batch {data.get('train_batch_size')}, {run.steps} optimizer steps, lr {c.get('trainer', {}).get('lr')}"
        )
        windows = ev.get("max_windows") or "all"
        if ev.get("window_sampling", "first") == "systematic" and windows != "all":
            windows = f"{windows} systematic (spread over the split)"
        elif windows != "all":
            windows = f"first {windows}"
        names = list(ev.get("tasks") or [])
        limits = []
        docs = "first" if ev.get("doc_seed") is None else f"seeded random, doc_seed {ev['doc_seed']}"
        if ev.get("limit") is not None or ev.get("mmlu_limit") is not None:
            limits.append(docs + " documents")
        if any(t != "spp_mmlu" for t in names):
            limits.append(f"limit {ev.get('limit')} per task")
        if "spp_mmlu" in names:
            mmlu_limit = ev.get("mmlu_limit") if ev.get("mmlu_limit") is not None else ev.get("limit")
            limits.append(f"5-shot, limit {mmlu_limit} per subject")
        tasks = f"{', '.join(names)} ({'; '.join(limits)})" if names else "none"
        seen[
            f"{trained}; calibration {cal.get('source')} {cal.get('nsamples')}×{cal.get('seqlen')}; "
            f"PPL {ev.get('ppl_source')} {windows} windows × {ev.get('seqlen')}; tasks {tasks}"
        ] = None
    return [f"- {line}" for line in seen]


def collect(table: str, roots: Iterable[str | Path], title: str | None = None, command: str | None = None) -> str:
    """The Markdown report of ``table`` over every ``summary.json`` below ``roots``.

    Raises:
        ValueError: an unknown table id (names the accepted ids).
    """
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}: use one of {', '.join(TABLE_IDS)} "
                         "(Table 1: python -m lab.table1_params)")
    runs = [load_run(p) for p in find_summaries(roots)]
    default_title, render = TABLES[table]
    parts = [f"# {title or default_title}", ""]
    if command:
        parts += [f"Command: `{command}`", ""]
    parts += render(group_runs(runs)) + [""]
    parts += [
        "Accuracies in %, lm-eval `acc`; Average/LM-eval = mean of the 7 zero-shot tasks (– = not evaluated). "
        "PPL = WikiText-2 test perplexity of the final (merged / re-masked) model. "
        "Cells are mean ± sample std over the seeds listed; a single run shows the 7-task mean with its standard "
        "error (se, from lm-eval's per-task acc_stderr) and, when the run recorded per-window NLL, PPL with its "
        "95 % percentile-bootstrap interval over windows [low, high]. Gap closed = (log PPL pruned − log PPL) / "
        "(log PPL pruned − log PPL dense), with its paired bootstrap interval when recorded."
        + (" Train loss (last) = mean of the last quarter (at most 10) of the logged per-step training losses; "
           "PPL pruned = the same model before training." if table == "table6" else ""),
        "",
        "Budgets:",
        *protocol_notes(runs),
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    """Command line: print the table and write it (atomically) with ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=TABLE_IDS, help="paper table id")
    parser.add_argument("runs", nargs="+", help="multirun directories (searched recursively for summary.json)")
    parser.add_argument("--out", help="Markdown file to write")
    parser.add_argument("--title", help="title line (default: the paper table's name)")
    parser.add_argument("--command", help="command line quoted under the title")
    args = parser.parse_args(argv)
    report = collect(args.table, args.runs, title=args.title, command=args.command)
    if args.out:
        write_text_atomic(args.out, report)
    sys.stdout.write(report)
    return report


if __name__ == "__main__":
    main()
