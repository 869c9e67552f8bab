"""The campaign's figure, drawn from the raw runs alone (``python -m lab.reconstruction figure
experiments/results/runs/reconstruction --out experiments/results/figures/reconstruction_smollm2_135m.png``).

Left: at Wanda 2:4, the share of the log-perplexity gap closed on the validation windows against training CPU
minutes, with 95 % window intervals: every seed-0 reconstruction alone (a point; the chosen one per form with its
interval), SPP end to end alone and the reconstruction then SPP end to end (curves with bands). Right: every
setting's chosen runs, the gap closed on the test windows with its interval. The numbers plotted are written beside
the PNG as JSON (``<out>.json``), which regenerates byte for byte from the raw files (the PNG's bytes depend on the
matplotlib build).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.reconstruction.grids import choices
from lab.reconstruction.records import VAL_SOURCE, Campaign, load
from lab.reconstruction.recovery import AT_MINUTES, TARGET, describe, gap, line, lines
from lab.reconstruction.report import cpu_minutes
from lab.recovery.labels import method_label, setting_label
from spp.atomic import write_text_atomic

ANCHOR = "nm2_4"


def _round(p: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in p.items()}


def scatter(c: Campaign, setting: str = ANCHOR) -> list[dict[str, Any]]:
    """Every seed-0 reconstruction alone of ``setting`` (grid and epochs points): form, rate, epochs, its point,
    whether it is its form's chosen setting."""
    ref = c.reference(setting, VAL_SOURCE)
    if ref is None:
        return []
    chosen = {ch.chosen.rel for ch in choices(c)}
    out = []
    for run in c.runs:
        if run.kind in ("grid", "epochs") and run.setting == setting and run.val and run.recon_cpu_s:
            ln = line(run, *ref)
            if ln is None:
                continue
            p = ln.points[0]
            out.append({"form": method_label(run.form), "lr": run.lr, "epochs": run.epochs,
                        "chosen": run.rel in chosen, **_round(p)})
    return out


def figure_data(root: str | Path) -> dict[str, Any]:
    """What the figure plots."""
    c = load(root)
    curves = [{"label": ln.label, "kind": ln.run.kind, "points": [_round(p) for p in ln.points]}
              for ln in lines(c) if ln.run.setting == ANCHOR and ln.run.curve]
    test = []
    for run in [ch.chosen for ch in choices(c)] + [r for r in c.runs if r.kind in ("e2e", "then_e2e")]:
        g = gap(run.dense_test, run.pruned_test, run.test)
        if g is not None:
            test.append({"setting": setting_label(run.setting), "label": describe(run), "cpu_min": cpu_minutes(run),
                         "gap": g["gap_closed"], "low": g["gap_closed_low"], "high": g["gap_closed_high"]})
    return {"setting": setting_label(ANCHOR), "points": scatter(c), "curves": curves,
            "test": [_round(t) for t in test], "at_minutes": AT_MINUTES, "target": TARGET}


def _draw_recovery(ax: Any, data: dict[str, Any]) -> None:
    forms = list(dict.fromkeys(p["form"] for p in data["points"]))
    for i, form in enumerate(forms):
        pts = [p for p in data["points"] if p["form"] == form]
        ax.plot([p["cpu_min"] for p in pts], [100 * p["gap"] for p in pts], "o", color=f"C{i}", mfc="white", ms=4,
                label=f"{form} form, reconstruction alone (grid points)")
        for p in (p for p in pts if p["chosen"]):
            ax.errorbar(p["cpu_min"], 100 * p["gap"], yerr=[[100 * (p["gap"] - p["low"])],
                        [100 * (p["high"] - p["gap"])]], fmt="o", color=f"C{i}", capsize=3)
    for j, cur in enumerate(data["curves"]):
        colour = f"C{len(forms) + j}"
        x = [p["cpu_min"] for p in cur["points"]]
        ax.plot(x, [100 * p["gap"] for p in cur["points"]], "-", color=colour, lw=1.5, label=cur["label"])
        ax.fill_between(x, [100 * p["low"] for p in cur["points"]], [100 * p["high"] for p in cur["points"]],
                        color=colour, alpha=0.15)
    ax.axvline(data["at_minutes"], color="0.5", lw=1, ls=":")
    ax.axhline(100 * data["target"], color="0.5", lw=1, ls=":")
    ax.set_title(f"{data['setting']}: validation windows")
    ax.set_xlabel("training CPU minutes (one thread; reconstruction + end-to-end steps)")
    ax.set_ylabel("log-PPL gap closed (%), 95 % window interval")
    ax.legend(frameon=False, fontsize=7)
    ax.grid(alpha=0.3)


def _draw_test(ax: Any, test: list[dict[str, Any]]) -> None:
    if not test:
        ax.text(0.5, 0.5, "no chosen setting yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    for y, t in enumerate(test):
        ax.errorbar(100 * t["gap"], y, xerr=[[100 * (t["gap"] - t["low"])], [100 * (t["high"] - t["gap"])]],
                    fmt="o", capsize=3, color="C0")
    ax.set_yticks(range(len(test)), [f"{t['setting']}: {t['label']} ({t['cpu_min']:.1f} CPU-min)" for t in test],
                  fontsize=7)
    ax.set_ylim(len(test) - 0.5, -0.5)
    ax.axvline(100 * TARGET, color="0.5", lw=1, ls=":")
    ax.set_xlim(left=min(0.0, min(100 * t["low"] for t in test)))
    ax.set_xlabel("log-PPL gap closed on the test windows (%), 95 % window interval")
    ax.grid(axis="x", alpha=0.3)


def draw(root: str | Path, out: str | Path) -> Path:
    """Draw both panels to ``out`` (PNG, written to a temporary name then renamed) and the data to ``out.json``.

    Raises:
        ValueError: nothing finished to draw.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = figure_data(root)
    if not data["points"] and not data["curves"] and not data["test"]:
        raise ValueError(f"nothing to draw under {root}: no finished reconstruction or end-to-end run with its "
                         "reference evaluations")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out.with_suffix(".json"), json.dumps(data, indent=1) + "\n")
    fig, (ax_c, ax_t) = plt.subplots(1, 2, figsize=(14, max(5.0, 0.35 * len(data["test"]) + 1.8)))
    _draw_recovery(ax_c, data)
    _draw_test(ax_t, data["test"])
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return tmp.replace(out)
