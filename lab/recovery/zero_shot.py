"""The recovery study's zero-shot rows: the dense and pruned models, the majority-class answer of the scored documents,
and each chosen seed-0 run, with the difference to SPP paired document by document (:mod:`spp.eval.paired`)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from lab.collect_summaries import markdown_table
from lab.recovery.choices import REFERENCE, Choice
from lab.recovery.labels import method_label, rate, setting_label
from lab.recovery.records import TEST_SOURCE, Campaign, EvalRun
from spp.eval.doc_records import majority_class
from spp.eval.paired import MEAN_ROW, paired_accuracy

# One forward pass of the same model through another CPU's float32 kernels: the dense reference (AVX2) against the
# AVX-512 runs differs by 8e-6 relative (28.43743 vs 28.43767); a different model differs by far more.
CPU_REL_TOL = 5e-5


def task_mean(docs: list[dict[str, Any]], metric: str) -> float | None:
    """Unweighted mean over tasks of the per-document ``metric`` (tasks without it left out)."""
    by_task: dict[str, list[float]] = {}
    for d in docs:
        if metric in d:
            by_task.setdefault(d["task"], []).append(float(d[metric]))
    return statistics.mean(statistics.mean(v) for v in by_task.values()) if by_task else None


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.2f}"


def _vs_spp(ev: EvalRun, spp: EvalRun | None, metric: str) -> str:
    if spp is None or ev is spp or not ev.docs or not spp.docs:
        return "–"
    row = next(r for r in paired_accuracy(ev.docs, spp.docs, metric) if r.task == MEAN_ROW)
    return f"{100 * row.diff:+.2f} [{100 * row.low:+.2f}, {100 * row.high:+.2f}] (MDD {100 * row.mdd:.2f})"


def _training_ppl(ev: EvalRun, setting: str, chosen: dict[tuple[str, str], Choice]) -> float | None:
    """The test PPL the training runs recorded for the model ``ev`` scored: the dense or pruned model's (every run
    of the setting measures them), else the chosen seed-0 run's merged model."""
    runs = [ch.chosen for (s, _m), ch in chosen.items() if s == setting]
    if ev.method in ("dense", "pruned"):
        measured = (getattr(r, f"{ev.method}_test") for r in runs)
        return next((m.get("ppl") for m in measured if m), None)
    ch = chosen.get((setting, ev.method))
    return ch.chosen.test.get("ppl") if ch is not None else None


def same_model(ev: EvalRun, setting: str, chosen: dict[tuple[str, str], Choice]) -> str:
    """``eval.py``'s test PPL, checked against the training run's (the model scored zero-shot IS the one trained
    and measured): ``94.12 (=)`` when they agree to 1e-6 relative, both numbers and their relative difference
    up to ``CPU_REL_TOL`` (one forward pass through AVX2 vs AVX-512 kernels), both in bold past it."""
    ppl = (ev.ppl.get(TEST_SOURCE) or {}).get("ppl")
    if ppl is None:
        return "–"
    ref = _training_ppl(ev, setting, chosen)
    if ref is None:
        return f"{ppl:.2f} (no run)"
    if math.isclose(ppl, ref, rel_tol=1e-6):
        return f"{ppl:.2f} (=)"
    rel = abs(ppl - ref) / abs(ref)
    if rel <= CPU_REL_TOL:  # the same model through another CPU's float32 kernels (e.g. the AVX2 dense reference)
        return f"{ppl:.2f} (run: {ref:.2f}, rel. diff {rel:.0e})"
    other = _other_grid_point(ev, setting, chosen, ppl)
    return f"{ppl:.2f} (**{other}**)" if other else f"{ppl:.2f} (**run: {ref:.2f}**)"


def _other_grid_point(ev: EvalRun, setting: str, chosen: dict[tuple[str, str], Choice], ppl: float) -> str | None:
    """Where ``ev`` scored a grid run other than the chosen rate's (the rate moved after scoring, e.g. when it was
    chosen on the mean over seeds): which one, else ``None``."""
    ch = chosen.get((setting, ev.method))
    if ch is None:
        return None
    hit = next((r for r in ch.grid if math.isclose(r.test.get("ppl", math.nan), ppl, rel_tol=1e-6)), None)
    return f"= the lr {rate(hit.lr)} seed-0 run, not the chosen rate's" if hit and hit is not ch.chosen else None


def _setting_rows(c: Campaign, setting: str, chosen: dict[tuple[str, str], Choice]) -> list[list[str]]:
    evals = [e for e in c.evals if e.docs and (e.setting == setting or (e.setting == "dense"))]
    spp = next((e for e in evals if e.setting == setting and e.method == REFERENCE), None)
    order = ["dense", "pruned", *(m for s, m in chosen if s == setting)]  # the results table's row order
    rows = []
    for ev in sorted(evals, key=lambda e: order.index(e.method) if e.method in order else len(order)):
        rows.append([setting_label(setting), method_label(ev.method), _pct(task_mean(ev.docs, "acc")),
                     _pct(task_mean(ev.docs, "acc_norm")), _vs_spp(ev, spp, "acc"), _vs_spp(ev, spp, "acc_norm"),
                     same_model(ev, setting, chosen)])
    if evals:
        majority = majority_class(evals[0].docs)
        rows.insert(0, [setting_label(setting), "majority class", _pct(statistics.mean(
            v["acc"] for v in majority.values())), "–", _majority_vs_spp(spp), "–", "–"])
    return rows


def majority_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``docs`` scored as the majority-class answer of each task would score them (``acc`` only), so the baseline
    pairs with a model document by document."""
    label = {task: int(v["label"]) for task, v in majority_class(docs).items()}
    return [{"task": d["task"], "doc_id": d["doc_id"], "doc_hash": d.get("doc_hash"),
             "acc": float(int(d["gold"]) == label[d["task"]])} for d in docs if d.get("gold") is not None]


def _majority_vs_spp(spp: EvalRun | None) -> str:
    """The majority-class answer against SPP's, paired per document (``acc``)."""
    if spp is None or not spp.docs:
        return "–"
    row = next(r for r in paired_accuracy(majority_docs(spp.docs), spp.docs, "acc") if r.task == MEAN_ROW)
    return f"{100 * row.diff:+.2f} [{100 * row.low:+.2f}, {100 * row.high:+.2f}] (MDD {100 * row.mdd:.2f})"


def zero_shot_table(c: Campaign, chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """The zero-shot section (empty when no run was scored with per-document records)."""
    settings = [s for s in dict.fromkeys(s for s, _ in chosen)]
    rows = [row for s in settings for row in _setting_rows(c, s, chosen)]
    if not rows:
        return []
    head = ["Setting", "Model", "7-task mean acc (%)", "mean acc_norm (%)", "Δ acc vs SPP [95 % paired] (pts)",
            "Δ acc_norm vs SPP [95 % paired] (pts)", "test PPL here (= training run's)"]
    return ["## Zero-shot (the shipped 200-document samples; differences paired per document)", "",
            *markdown_table(head, rows, 2), "",
            "acc_norm: the tasks lm-eval reports it for (HellaSwag, ARC-e, ARC-c, OBQA). Majority class: always the "
            "most frequent correct answer of each task among the scored documents, paired with SPP document by "
            "document on `acc`. MDD = the difference a "
            "two-sided 5 % test would detect with 80 % power, from the paired variance (`spp/eval/paired.py`). "
            "test PPL here: `eval.py`'s WikiText-2 test perplexity of the model it scored, `(=)` when it equals the "
            "training run's to 1e-6 (the scored model is the trained one; masked full FT is scored from its export, "
            "resumed from the run's last checkpoint); the training run's value and the relative difference when they "
            f"differ by at most {CPU_REL_TOL:.0e} (the same model through another CPU's float32 kernels: the dense "
            "reference ran on the AVX2 machine), both in bold past that; a row that scored another rate's seed-0 run "
            "than the one now chosen (a rate chosen on the mean over seeds after it was scored) says which.", ""]
