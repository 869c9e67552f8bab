"""The recovery report's section on block-wise reconstruction (``lab/recovery/reconstruction_rows.py``) on a synthetic
pair of campaigns written in both runners' raw layouts: the ratio reconstruction / SPP against an independent
computation, "not paired" where the pruned model differs (and the ratio once it is the same), and no section without
a reconstruction campaign beside the recovery one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import test_reconstruction_report as recon_fixtures
from test_recovery_study import BASE, WINDOWS, write_train

from lab.recovery.reconstruction_rows import TITLE, not_paired_reason
from lab.recovery.tables import report

SPP_TEST = (-0.45, -0.44, -0.43)
"""SPP's merged test NLL shift per seed (0, 1, 2) at the chosen rate."""
RECON_TEST = (-0.30, -0.33, -0.28)
"""The chosen reconstruction's merged test NLL shift per seed."""


def write_pair(runs: Path, pruned_50: float) -> tuple[Path, Path]:
    """``runs/recovery`` (SPP at Wanda 2:4 with seeds 0-3, at unstructured 50 % seed 0) and ``runs/reconstruction``
    (masked full FT chosen at Wanda 2:4 with seeds 0-2; a 50 % check whose pruned model is at ``BASE + pruned_50``)
    on the same windows; the recovery study's pruned model is at ``BASE`` in both settings."""
    recovery, recon = runs / "recovery", runs / "reconstruction"
    for lr, val in [(1e-2, -0.2), (2e-2, -0.4), (5e-2, -0.3)]:
        write_train(recovery, f"grid/nm2_4/spp/lr{lr:g}", "spp", lr, 0, SPP_TEST[0] if lr == 2e-2 else val, val,
                    noise=0.02)
        write_train(recovery, f"grid/unstructured50/spp/lr{lr:g}", "spp", lr, 0, val, val, sparsity="unstructured50")
    for s in (1, 2, 3):  # seed 3: SPP only, so not paired
        write_train(recovery, f"seeds/nm2_4/spp/s{s}", "spp", 2e-2, s, SPP_TEST[s] if s < 3 else -0.9, -0.4,
                    noise=0.02)
    recon_fixtures.write_reference(recon, (("dense", -1.5), ("nm2_4", 0.0), ("unstructured50", pruned_50)))
    for lr, val in [(1e-3, -0.1), (3e-3, -0.3), (1e-2, -0.2)]:
        write_run(recon, f"grid/nm2_4/masked_full/e3/lr{lr:g}", lr, 0, RECON_TEST[0] if lr == 3e-3 else val, val)
    for s in (1, 2):
        write_run(recon, f"seeds/nm2_4/masked_full/lr0.003/e3/s{s}", 3e-3, s, RECON_TEST[s], -0.3)
    write_run(recon, "check/unstructured50/masked_full/lr0.003/e3", 3e-3, 0, -0.2, -0.2, sparsity="unstructured50",
              pruned=pruned_50)
    return recovery, recon


def write_run(root: Path, rel: str, lr: float, seed: int, test: float, val: float, **kw: object) -> Path:
    """A reconstruction job (masked full FT form, 3 epochs) in the reconstruction runner's layout."""
    return recon_fixtures.write_run(root, rel, form="masked_full", lr=lr, seed=seed, test=test, val=val, noise=0.05,
                                    **kw)


@pytest.fixture(autouse=True)
def same_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both fixtures' entries on one per-window difficulty, so the two campaigns can measure the same models."""
    monkeypatch.setattr(recon_fixtures, "BASE", BASE)


def section(text: str) -> str:
    return text.split(TITLE)[1].split("\n## ")[0]


def row(text: str, start: str) -> list[str]:
    """The cells of the one table row starting with ``start``."""
    [line] = [line for line in section(text).splitlines() if line.startswith(start)]
    return [cell.strip() for cell in line.strip("|").split("|")]


def nll(shift: float, seed: int, noise: float) -> np.ndarray:
    """The per-window NLL both fixtures write for ``shift`` and ``seed`` (independently of lab's readers)."""
    return BASE + shift + np.random.default_rng(seed).normal(0, noise, WINDOWS)


def test_ratio_equals_an_independent_computation(tmp_path: Path):
    recovery, _ = write_pair(tmp_path / "runs", pruned_50=0.0)
    text = report(recovery)
    cells = row(text, "| Wanda 2:4 | reconstruction | masked full FT form, lr 3e-3, 3 ep. |")
    # paired on the seeds both ran (0-2; SPP's seed 3 would move the ratio a lot)
    d = np.stack([nll(RECON_TEST[s], s, 0.05) - nll(SPP_TEST[s], s, 0.02) for s in range(3)])  # (seeds, windows)
    half = 4.302653 * math.sqrt(d.mean(axis=1).var(ddof=1) / 3 + d.mean(axis=0).var(ddof=1) / WINDOWS)
    assert cells[8:11] == ["0,1,2", f"{math.exp(d.mean()):.3f}",
                           f"[{math.exp(d.mean() - half):.3f}, {math.exp(d.mean() + half):.3f}]"]
    assert cells[12] == ", ".join(f"{math.exp(v):.3f}" for v in d.mean(axis=1))
    assert cells[13] == "SPP better"  # the reconstruction's NLL is ~0.14 nats above SPP's on every seed
    spp = row(text, "| Wanda 2:4 | recovery | SPP, lr 2e-2 |")
    assert spp[3] == "0,1,2,3" and spp[5] == "10.5 ± 0.0 (wall)" and spp[8:14] == ["–"] * 6
    assert row(text, "| Wanda 2:4 | reconstruction |")[5] == "5.0 ± 0.0 (CPU)"


def test_another_pruned_model_is_not_paired_and_the_same_one_is(tmp_path: Path):
    recovery, _ = write_pair(tmp_path / "differs" / "runs", pruned_50=0.05)
    cells = row(report(recovery), "| Wanda unstructured 50 % | reconstruction |")
    pruned_spp, pruned_recon = math.exp(BASE.mean()), math.exp(BASE.mean() + 0.05)
    assert cells[9] == (f"not paired: another pruned model: pruned test PPL {pruned_recon:.2f} in the reconstruction "
                        f"runs, {pruned_spp:.2f} in SPP's")
    assert cells[8] == "–" and cells[10:14] == ["–"] * 4
    # negative control: the same pruned model -> a ratio on seed 0 with the windows-only interval
    recovery, _ = write_pair(tmp_path / "same" / "runs", pruned_50=0.0)
    cells = row(report(recovery), "| Wanda unstructured 50 % | reconstruction |")
    d = nll(-0.2, 0, 0.05) - nll(-0.4, 0, 0.0)  # the check run against SPP's chosen 50 % grid point (val -0.4)
    assert cells[8:10] == ["0", f"{math.exp(d.mean()):.3f}"] and cells[10] == "–"
    assert "not paired" not in section(report(recovery))


def test_pairing_needs_the_same_windows_and_a_close_pruned_perplexity():
    def run(ppl: float, starts: list[int]) -> object:
        entry = {"ppl": ppl, "source": "wikitext2", "seqlen": 512, "window_starts": starts}
        return type("Run", (), {"pruned_test": entry, "test": entry})()

    same = list(range(0, 512 * 4, 512))
    assert not_paired_reason([run(208.9142, same)], [run(208.9067, same)]) is None  # AVX-512 vs AVX2, same model
    assert "another pruned model" in not_paired_reason([run(132.95, same)], [run(128.12, same)])
    assert "other test windows" in not_paired_reason([run(208.91, same)], [run(208.91, same[::-1])])


def test_no_section_without_a_reconstruction_campaign(tmp_path: Path):
    recovery, recon = write_pair(tmp_path / "runs", pruned_50=0.0)
    assert TITLE in report(recovery)
    recon.rename(tmp_path / "elsewhere")
    assert TITLE not in report(recovery)
