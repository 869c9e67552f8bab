"""The recovery study's figure, drawn from the committed raw runs alone (``python -m lab.recovery figure
experiments/results/runs/recovery --out experiments/results/figures/recovery.png``).

Left: every method's test-perplexity ratio to SPP in each setting with the paired 95 % interval its verdict uses
(:attr:`~lab.recovery.stats.PairedRatio.interval`: the small-sample t interval with 2 to 9 seeds, the windows-only
bootstrap with one; below 1 = better than SPP), the evidence the text relies on. Right: recovery per CPU-minute at
Wanda 2:4, the share of the log-perplexity gap closed on the validation windows against training CPU minutes, with its
bootstrap band. The numbers plotted are written beside the PNG as JSON (``<out>.json``), which regenerates byte for
byte from the raw files (the PNG's bytes depend on the matplotlib build).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.recovery.choices import against_reference, choices
from lab.recovery.labels import method_label, setting_label
from lab.recovery.records import load
from lab.recovery.recovery import AT_MINUTES, TARGET, curves, machine_key, machine_letters, run_label
from spp.atomic import write_text_atomic


def figure_data(root: str | Path) -> dict[str, Any]:
    """What the figure plots: the paired ratios against SPP and the recovery curves."""
    c = load(root)
    chosen = choices(c)
    ratios = [{"setting": setting_label(ch.setting), "method": method_label(ch.method), "seeds": seeds,
               "ratio": round(p.ratio, 6), "low": round(p.interval[0], 6),
               "high": round(p.interval[1], 6)}
              for ch, seeds, p in against_reference(chosen)]
    letters = machine_letters(c)
    recovery = [{"setting": setting_label(r.setting), "method": run_label(r), "cpu": letters[machine_key(r)],
                 "rerun": r.kind == "recovery_check",
                 "points": [{k: round(v, 6) if isinstance(v, float) else v for k, v in p.items()} for p in pts]}
                for r, pts in curves(c)]
    return {"ratios": ratios, "recovery": recovery, "at_minutes": AT_MINUTES, "target": TARGET}


def _draw_ratios(ax: Any, ratios: list[dict[str, Any]]) -> None:
    if not ratios:
        ax.text(0.5, 0.5, "no method paired with SPP yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    labels = [f"{r['setting']}: {r['method']} ({len(r['seeds'])} seed{'s' if len(r['seeds']) > 1 else ''})"
              for r in ratios]
    for y, r in enumerate(ratios):  # one seed: an open grey marker, as its interval names no winner (labels.verdict)
        colour = "0.4" if len(r["seeds"]) < 2 else "C0" if r["high"] < 1 else "C3" if r["low"] > 1 else "0.4"
        ax.errorbar(r["ratio"], y, xerr=[[r["ratio"] - r["low"]], [r["high"] - r["ratio"]]], fmt="o", capsize=3,
                    color=colour, mfc="white" if len(r["seeds"]) < 2 else colour)
    ax.axvline(1.0, color="k", lw=1, ls="--")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel("test PPL ratio method / SPP (95 % paired: small-sample t over seeds); < 1: better than SPP;\n"
                  "red / blue: SPP / method better over ≥ 2 seeds; open: 1 seed (windows only)")
    ax.grid(axis="x", alpha=0.3)


def _draw_recovery(ax: Any, data: dict[str, Any]) -> None:
    if not data["recovery"]:
        ax.text(0.5, 0.5, "no recovery run yet\n(bash experiments/recovery/run.sh REC)", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    colours = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(c["method"].removesuffix(" (re-run)")
                                                              for c in data["recovery"]))}
    for cur in data["recovery"]:  # a re-run on another CPU: dashed, in its method's colour, no band
        x, colour = [p["cpu_min"] for p in cur["points"]], colours[cur["method"].removesuffix(" (re-run)")]
        ax.plot(x, [100 * p["gap"] for p in cur["points"]], "s--" if cur["rerun"] else "o-", color=colour, ms=3,
                label=f"{cur['method']}, CPU {cur['cpu']}")
        if not cur["rerun"]:
            ax.fill_between(x, [100 * p["low"] for p in cur["points"]], [100 * p["high"] for p in cur["points"]],
                            color=colour, alpha=0.15)
    ax.axvline(data["at_minutes"], color="0.5", lw=1, ls=":")
    ax.axhline(100 * data["target"], color="0.5", lw=1, ls=":")
    ax.set_xlabel("training CPU minutes (one thread)")
    ax.set_ylabel("log-PPL gap closed, validation (%)")
    ax.legend(frameon=False, fontsize=8)
    ax.grid(alpha=0.3)


def draw(root: str | Path, out: str | Path) -> Path:
    """Draw both panels to ``out`` (PNG, written to a temporary name then renamed) and the data to ``out.json``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = figure_data(root)
    if not data["ratios"] and not data["recovery"]:
        raise ValueError(f"nothing to draw under {root}: no method has both a grid and SPP's in one setting, and no "
                         "recovery run")
    out = Path(out)
    write_text_atomic(out.with_suffix(".json"), json.dumps(data, indent=1) + "\n")
    fig, (ax_r, ax_c) = plt.subplots(1, 2, figsize=(14, 0.4 * max(len(data["ratios"]), 8) + 1.8))
    _draw_ratios(ax_r, data["ratios"])
    _draw_recovery(ax_c, data)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return tmp.replace(out)
