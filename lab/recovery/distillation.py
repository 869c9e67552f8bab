"""Distillation against cross-entropy : each distilled method trains at its cross-entropy rate with
the same seeds (``distill/<setting>/<method>/s<seed>``, ``objective=distill``, the dense model as teacher). Each is
paired seed by seed with the same method's cross-entropy runs, and SPP's order against its closest competitor is
compared under both objectives (the two-level paired ratio of :mod:`~lab.recovery.stats`)."""

from __future__ import annotations

import statistics

from lab.collect_summaries import markdown_table
from lab.recovery.choices import REFERENCE, Choice, closest_competitor, method_order, paired_runs
from lab.recovery.labels import cpu_capabilities, interval_text, method_label, rate, setting_label, verdict
from lab.recovery.records import SETTINGS, Campaign, TrainRun
from lab.recovery.stats import PairedRatio


def distilled(c: Campaign) -> dict[tuple[str, str], list[TrainRun]]:
    """The distillation runs by (setting, method without ``+distill``) in table order, by seed."""
    out: dict[tuple[str, str], list[TrainRun]] = {}
    for r in c.train:
        if r.kind == "distill":
            out.setdefault((r.setting, r.method.partition("+")[0]), []).append(r)
    order = list(SETTINGS)
    return {k: sorted(out[k], key=lambda r: r.seed) for k in sorted(
        out, key=lambda k: (order.index(k[0]) if k[0] in order else len(order), method_order(k[1])))}


def _mean(runs: list[TrainRun], seeds: list[int]) -> float:
    return statistics.mean(r.test["ppl"] for r in runs if r.seed in seeds)


def _ratio(p: PairedRatio) -> str:
    """The ratio with the interval its verdict uses (:attr:`PairedRatio.interval`)."""
    return f"{p.ratio:.3f} {interval_text(*p.interval)}"


def _rows(distill: dict[tuple[str, str], list[TrainRun]], chosen: dict[tuple[str, str], Choice]) -> list[list[str]]:
    """Per distilled method: both objectives' mean test PPL on their shared seeds and the paired distill / CE ratio."""
    rows = []
    for key, runs in distill.items():
        ce = chosen.get(key)
        pair = paired_runs(runs, ce.runs) if ce else None
        if pair is None:
            continue
        seeds, p = pair
        rows.append([setting_label(key[0]), method_label(key[1]), rate(ce.chosen.lr), ",".join(map(str, seeds)),
                     f"{_mean(list(ce.runs), seeds):.2f}", f"{_mean(runs, seeds):.2f}", _ratio(p),
                     interval_text(p.low, p.high), verdict(p.interval[1], p.interval[0], len(seeds), "distill",
                                                           "cross-entropy"),
                     f"{cpu_capabilities([r for r in ce.runs if r.seed in seeds])} → {cpu_capabilities(runs)}"])
    return rows


def ranking_lines(distill: dict[tuple[str, str], list[TrainRun]], chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """Per setting where SPP and its closest competitor were both distilled: their paired ratio under each objective
    on the seeds distilled (a cross-entropy pair over more seeds would compare seed counts, not objectives) and
    whether the order of their means or the verdict changed."""
    lines = []
    for setting in dict.fromkeys(s for s, _ in distill):
        rival = closest_competitor(chosen, setting)
        spp_ce, rival_ce = chosen.get((setting, REFERENCE)), chosen.get((setting, rival)) if rival else None
        kd = paired_runs(distill.get((setting, rival), []), distill.get((setting, REFERENCE), []))
        if kd is None or spp_ce is None or rival_ce is None:
            continue
        ce = paired_runs(*([r for r in ch.runs if r.seed in kd[0]] for ch in (rival_ce, spp_ce)))  # the same seeds
        if ce is None:
            continue
        said = []
        for name, (seeds, p) in (("cross-entropy", ce), ("distillation", kd)):
            lower = method_label(rival) if p.ratio < 1.0 else "SPP"
            said.append((lower, verdict(p.interval[1], p.interval[0], len(seeds), method_label(rival), "SPP"),
                         f"{name} (seeds {','.join(map(str, seeds))}): {method_label(rival)} / SPP {_ratio(p)}, "
                         f"lower mean {lower}"))
        change = "no" if said[0][:2] == said[1][:2] else (
            "the verdict changed" if said[0][1] != said[1][1] else "only the order of the means changed")
        lines.append(f"- {setting_label(setting)}: {said[0][2]}, {said[0][1]}; {said[1][2]}, {said[1][1]}. "
                     f"Ranking changed by distillation: **{change}**.")
    return lines


def distillation_table(c: Campaign, chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """The distillation section (empty until a distillation run exists)."""
    distill = distilled(c)
    rows = _rows(distill, chosen)
    if not rows:
        return []
    head = ["Setting", "Method", "lr (CE's)", "Seeds", "CE test PPL (mean)", "distill test PPL (mean)",
            "distill / CE [95 % small-sample t] (verdict)", "[95 % bootstrap]", "Verdict", "CPU (CE → distill)"]
    mixed = [r for r in rows if len(set(r[-1].split(" → "))) > 1]
    machines = (f"The pairs of {len(mixed)} of {len(rows)} rows ran on different machines (CPU column, from the runs' "
                "`machine.json`): the cross-entropy runs on one CPU kind, the distilled runs on the other. The same "
                "model's forward pass differs by about 1e-5 relative between AVX2 and AVX-512 kernels, but a training "
                "run on other kernels follows another float32 trajectory, so the machine changes together with the "
                "objective in these pairs and is not separated from it. " if mixed else "")
    return ["## Distillation (the dense model as teacher) against cross-entropy", "", *markdown_table(head, rows, 2),
            "", *ranking_lines(distill, chosen), "",
            "Each distilled run trains at its method's cross-entropy rate (chosen on validation) with the same seed, "
            "data order and windows, so the ratios are paired seed by seed (intervals as in the paired table: the "
            f"small-sample t decides the verdict, the two-level bootstrap beside it). {machines}".rstrip(), ""]
