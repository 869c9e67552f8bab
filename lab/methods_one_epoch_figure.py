"""Figure of the one-epoch methods comparison, drawn from the committed raw runs alone.

Use: ``python -m lab.methods_one_epoch_figure experiments/results/runs/methods_one_epoch --out
experiments/results/figures/methods_one_epoch.png``. Left: WikiText-2 perplexity of every run with its 95 % bootstrap
interval over windows (log scale; one marker per seed), the same run's pruned model before fine-tuning as a grey
cross, the dense model as a line. Right: 7-task zero-shot mean with ±1.96 standard errors. Groups: sparsity (and
pruner) × method, in the tables' order.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.collect_summaries import sparsity_label
from lab.labels import method_labels
from lab.methods_one_epoch import Z95, group_campaign, load_campaign, model_label
from spp.eval.harness import zero_shot_mean, zero_shot_mean_stderr


def draw(roots: list[str | Path], out: str | Path) -> Path:
    """Draw the two panels and save a PNG at ``out`` (written to a temporary name, then renamed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = group_campaign(load_campaign(roots))
    fig, (ax_ppl, ax_zs) = plt.subplots(1, 2, figsize=(13, 0.45 * len(groups) + 1.8), sharey=True)
    labels, dense, pruned_drawn = [], None, False
    for y, (key, runs) in enumerate(groups.items()):
        labels.append(f"{sparsity_label(key)} {model_label(key)}")
        which = "merged" if key.adapter != "none" else "pruned"
        color = f"C{list(method_labels()).index(key.adapter)}"
        for i, r in enumerate(runs):
            dy = (i - (len(runs) - 1) / 2) * 0.15
            e = r.perplexity[which]
            dense = dense or r.perplexity.get("dense")
            ax_ppl.errorbar(e["ppl"], y + dy, xerr=[[e["ppl"] - e["ci_low"]], [e["ci_high"] - e["ppl"]]], fmt="o",
                            color=color, capsize=3)
            if which == "merged" and r.perplexity.get("pruned"):
                ax_ppl.plot(r.perplexity["pruned"]["ppl"], y + dy, "x", color="0.5",
                            label="before fine-tuning" if not pruned_drawn else None)
                pruned_drawn = True
            mean, se = zero_shot_mean(r.run.tasks), zero_shot_mean_stderr(r.run.tasks)
            if mean is not None and se is not None:
                ax_zs.errorbar(100 * mean, y + dy, xerr=100 * Z95 * se, fmt="o",
                               color=color, capsize=3)
    if dense:
        ax_ppl.axvline(dense["ppl"], color="k", ls="--", lw=1, label=f"dense {dense['ppl']:.1f}")
    ax_ppl.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    ax_ppl.set_ylim(len(labels) - 0.5, -0.5)
    ax_ppl.set_xscale("log")
    ax_ppl.set_xlabel("WikiText-2 perplexity (95 % bootstrap interval over windows)")
    ax_zs.set_xlabel("7-task zero-shot mean acc (%) ± 1.96 se")
    ax_ppl.set_yticks(range(len(labels)), labels)
    for ax in (ax_ppl, ax_zs):
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="campaign directories (searched recursively for summary.json)")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args(argv)
    try:
        print(draw(args.runs, args.out))
    except (FileNotFoundError, ValueError) as err:
        print(f"methods_one_epoch_figure: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
