"""Block-wise reconstruction beside the recovery methods: per setting, SPP's chosen runs of the recovery study next to
the reconstruction study's chosen runs (each form's chosen setting, :func:`lab.reconstruction.grids.choices`, with all
its seeds), on the WikiText-2 test windows.

The paired test-PPL ratio reconstruction / SPP (:func:`lab.recovery.stats.paired_ratio`, the paired table's interval
rules) is computed only where both rows measured the same pruned model on the same windows: every run's pruned test
entry has the same source, sequence length and window starts, its perplexity agrees to :data:`PRUNED_RTOL` (float32
results of one model differ in about the 5th digit between AVX2 and AVX-512 machines), and the merged entries lie on
those windows. Otherwise the row says why and computes no ratio. The reconstruction campaign is read from
:data:`RECONSTRUCTION_DIR` beside the recovery campaign; without it the section is empty."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lab.collect_summaries import markdown_table
from lab.reconstruction.grids import Choice as ReconChoice
from lab.reconstruction.grids import choices as recon_choices
from lab.reconstruction.grids import order as recon_order
from lab.reconstruction.records import Run
from lab.reconstruction.records import load as load_reconstruction
from lab.reconstruction.recovery import describe, gap
from lab.reconstruction.report import cpu_minutes
from lab.recovery.choices import REFERENCE, Choice
from lab.recovery.labels import cpu_capabilities, interval_text, method_label, rate, setting_label, verdict
from lab.recovery.records import TrainRun
from lab.recovery.stats import PairedRatio, gap_closed_per_seed, paired_ratio

RECONSTRUCTION_DIR = "reconstruction"
"""The reconstruction campaign's directory, beside the recovery campaign's (``experiments/results/runs/``)."""
PRUNED_RTOL = 1e-3
"""Relative tolerance on the pruned model's test perplexity for two runs to count as the same pruned model."""
TITLE = "## Block-wise reconstruction beside the recovery methods (WikiText-2 test)"


def reconstruction_root(recovery_root: str | Path) -> Path:
    """The reconstruction campaign beside the recovery campaign ``recovery_root``."""
    return Path(recovery_root).parent / RECONSTRUCTION_DIR


def _windows(entry: dict[str, Any]) -> tuple[Any, ...]:
    return entry.get("source"), entry.get("seqlen"), tuple(entry.get("window_starts") or ())


def not_paired_reason(recon: Sequence[Run], spp: Sequence[TrainRun]) -> str | None:
    """Why the reconstruction runs ``recon`` and SPP's runs ``spp`` cannot be paired; ``None`` when every run
    measured the same pruned model (test perplexity within :data:`PRUNED_RTOL`) on the same windows."""
    pruned = [r.pruned_test for r in (*recon, *spp)]
    if not recon or not spp:
        return "no runs on one side"
    if any(p is None for p in pruned):
        return "a run recorded no pruned test perplexity"
    if any(_windows(e) != _windows(pruned[0]) for e in [*pruned, *(r.test for r in (*recon, *spp))]):
        return "other test windows (source, length or window starts differ)"
    ours, theirs = [r.pruned_test["ppl"] for r in recon], [r.pruned_test["ppl"] for r in spp]  # type: ignore[index]
    if all(math.isclose(a, b, rel_tol=PRUNED_RTOL) for a in ours for b in theirs):
        return None
    return (f"another pruned model: pruned test PPL {_values(ours)} in the reconstruction runs, {_values(theirs)} in "
            "SPP's")


def largest_pruned_difference(recon: Sequence[Run], spp: Sequence[TrainRun]) -> float:
    """The largest relative difference between the pruned test perplexities of any two of the runs."""
    values = [r.pruned_test["ppl"] for r in (*recon, *spp) if r.pruned_test]
    return (max(values) - min(values)) / min(values) if values else 0.0


def _values(values: Iterable[float]) -> str:
    return ", ".join(dict.fromkeys(f"{v:.2f}" for v in values))


def _spread(values: Sequence[float], digits: int) -> str:
    """One value, or ``mean ± sample std`` of several."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _test_and_gap(tests: Sequence[dict[str, Any]], dense: dict[str, Any] | None,
                  pruned: dict[str, Any] | None) -> list[str]:
    """Test PPL and gap closed as the main table writes them: one run with its window interval, several as
    ``mean ± sample std``."""
    if len(tests) == 1:
        t, g = tests[0], gap(dense, pruned, tests[0])
        gap_text = (f"{100 * g['gap_closed']:.1f} [{100 * g['gap_closed_low']:.1f}, {100 * g['gap_closed_high']:.1f}]"
                    if g else "–")
        return [f"{t['ppl']:.2f} [{t['ci_low']:.2f}, {t['ci_high']:.2f}]", gap_text]
    gaps = gap_closed_per_seed(dense, pruned, tests) if dense and pruned else []
    return [_spread([t["ppl"] for t in tests], 2), _spread([100 * v for v in gaps], 1) if gaps else "–"]


def _spp_row(ch: Choice) -> list[str]:
    runs = ch.runs
    minutes = [r.train_s / 60 for r in runs if r.train_s]
    return [setting_label(ch.setting), "recovery", f"{method_label(REFERENCE)}, lr {rate(ch.chosen.lr)}",
            ",".join(str(r.seed) for r in runs), _values(r.pruned_test["ppl"] for r in runs if r.pruned_test),
            f"{_spread(minutes, 1)} (wall)" if minutes else "–",
            *_test_and_gap([r.test for r in runs], runs[0].dense_test, runs[0].pruned_test),
            "–", "–", "–", "–", "–", "–", cpu_capabilities(runs)]


def shared_seeds(recon: ReconChoice, spp: Choice) -> tuple[list[int], list[Run], list[TrainRun]]:
    """The seeds both ran and each side's runs on them, by seed."""
    mine, theirs = {r.seed: r for r in recon.seeds}, {r.seed: r for r in spp.runs}
    seeds = sorted(mine.keys() & theirs.keys())
    return seeds, [mine[s] for s in seeds], [theirs[s] for s in seeds]


def paired(recon: ReconChoice, spp: Choice | None) -> tuple[list[int], PairedRatio] | str:
    """The paired ratio reconstruction / SPP on the seeds both ran, or why there is none (the pruned model is
    checked on the runs of those seeds)."""
    if spp is None:
        return "no SPP run of the recovery study in this setting"
    seeds, mine, theirs = shared_seeds(recon, spp)
    if not seeds:
        return "no seed both studies ran"
    reason = not_paired_reason(mine, theirs)
    if reason is not None:
        return reason
    return seeds, paired_ratio([r.test for r in mine], [r.test for r in theirs])


def _recon_row(recon: ReconChoice, spp: Choice | None) -> list[str]:
    runs = recon.seeds
    first = runs[0]
    head = [setting_label(recon.setting), "reconstruction", describe(recon.chosen), ",".join(str(r.seed) for r in runs),
            _values(r.pruned_test["ppl"] for r in runs if r.pruned_test),
            f"{_spread([cpu_minutes(r) for r in runs], 1)} (CPU)",
            *_test_and_gap([r.test for r in runs], first.dense_test, first.pruned_test)]
    pair = paired(recon, spp)
    if isinstance(pair, str):
        return [*head, "–", f"not paired: {pair}", "–", "–", "–", "–",
                cpu_capabilities([*runs, *(spp.runs if spp else ())])]
    seeds, p = pair
    cpus = cpu_capabilities([r for r in (*runs, *(spp.runs if spp else ())) if r.seed in seeds])
    return [*head, ",".join(map(str, seeds)), f"{p.ratio:.3f}", interval_text(p.t_low, p.t_high),
            interval_text(p.low, p.high), ", ".join(f"{v:.3f}" for v in p.per_seed),
            verdict(p.interval[1], p.interval[0], len(seeds), "reconstruction", "SPP"), cpus]


def rows(recon: list[ReconChoice], chosen: dict[tuple[str, str], Choice]) -> list[list[str]]:
    """Per setting the reconstruction study ran: SPP's chosen runs, then each form's chosen reconstruction."""
    out = []
    for setting in sorted({ch.setting for ch in recon}, key=lambda s: recon_order(s, None)):
        spp = chosen.get((setting, REFERENCE))
        if spp is not None:
            out.append(_spp_row(spp))
        out += [_recon_row(ch, spp) for ch in recon if ch.setting == setting]
    return out


def _recipe(root: Path, run: Run) -> dict[str, Any]:
    """The run's recorded ``config.reconstruct``."""
    return json.loads((root / run.rel / "summary.json").read_text())["config"].get("reconstruct") or {}


def _joined(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in dict.fromkeys(values))


def protocol_lines(root: Path, recon: list[ReconChoice], chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """How the rows' runs differ, read from their records: what trains on what, the clocks, threads and seeds."""
    spp = [r for (_, m), ch in chosen.items() if m == REFERENCE for r in ch.runs]
    runs = [r for ch in recon for r in ch.seeds]
    recipes = [_recipe(root, r) for r in runs]
    pairs = [shared_seeds(ch, chosen[(ch.setting, REFERENCE)])[1:] for ch in recon if (ch.setting, REFERENCE) in chosen]
    same = [largest_pruned_difference(*pair) for pair in pairs if pair[0] and not_paired_reason(*pair) is None]
    threads = {name: _joined(sorted(str(r.machine.get("omp_num_threads") or "not recorded") for r in group))
               for name, group in (("SPP", spp), ("reconstruction", runs))}
    return [
        f"How the runs differ (their records). SPP (recovery study) trains its adapters end to end on Alpaca with "
        f"cross-entropy, {_joined(sorted(r.steps for r in spp))} optimizer steps per run; each reconstruction trains "
        f"the pruned model block by block (`config.reconstruct`: loss {_joined(x.get('loss') for x in recipes)}, "
        f"inputs {_joined(x.get('inputs') for x in recipes)}, targets {_joined(x.get('targets') for x in recipes)}, "
        f"{_joined(x.get('nsamples') for x in recipes)} windows of {_joined(x.get('seqlen') for x in recipes)} tokens "
        f"of {_joined(x.get('source') for x in recipes)}, {_joined(sorted(r.epochs for r in runs))} epochs) and is "
        "not trained end to end afterwards. Training minutes: the reconstruction's process CPU time "
        "(`reconstruction.timings.cpu_seconds`, the original run's on a cache hit); SPP's wall time of its training "
        "loop (`timings.train`, its in-training validation included; these runs recorded no CPU time). Threads per "
        f"job (`machine.json`): SPP {threads['SPP']}, reconstruction {threads['reconstruction']}. Seeds: several -> "
        "mean ± sample std over seeds, one -> its 95 % window interval.",
        "",
        "Pairing: a ratio only where every run of both rows measured the pruned model's test perplexity equal to "
        f"within {100 * PRUNED_RTOL:g} % on the same window starts (the paired rows' pruned perplexities differ by at "
        f"most {max(same, default=0.0):.1e} relative; the CPU column names the machines); otherwise the row says why "
        "and no ratio is computed. Paired on the seeds both ran: the two "
        "studies' seed s share no initialisation or data order, so the seed pairing only lines up independent draws "
        "and the windows carry the pairing. Interval and verdict as in the paired table (small-sample t for 2 to 9 "
        "seeds, the windows bootstrap for one seed, which names no winner); the two-level bootstrap beside it.",
        ""]


def reconstruction_section(recovery_root: str | Path, chosen: dict[tuple[str, str], Choice]) -> list[str]:
    """The report section; empty when the reconstruction campaign is absent beside ``recovery_root``."""
    root = reconstruction_root(recovery_root)
    if not root.is_dir():
        return []
    recon = recon_choices(load_reconstruction(root))
    if not recon:
        return [TITLE, "", "Not run yet: the reconstruction campaign has no chosen run.", ""]
    head = ["Setting", "Study", "Run", "Seeds", "pruned test PPL", "training min (clock)", "test PPL",
            "Gap closed, test (%)", "paired seeds", "test PPL ratio reconstruction / SPP",
            "[95 % small-sample t] (verdict)", "[95 % bootstrap]", "per seed", "Verdict", "CPU (paired seeds)"]
    return [TITLE, "", f"The reconstruction study's runs (`{RECONSTRUCTION_DIR}/` beside this campaign: each form's "
            "chosen setting with its seeds, `lab/reconstruction/grids.py`) beside SPP's chosen runs of this study.", "",
            *markdown_table(head, rows(recon, chosen), 3), "", *protocol_lines(root, recon, chosen)]
