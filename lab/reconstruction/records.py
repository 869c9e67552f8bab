"""The raw files of the reconstruction campaign (``experiments/reconstruction/run.sh``), read into plain records.

Layout under the campaign directory: ``reference/dense`` and ``reference/<setting>`` (``eval.py``: dense and pruned
perplexities), ``grid/<setting>/<form>/e<epochs>/lr<rate>`` (reconstruction alone, seed 0),
``epochs/<setting>/<form>/lr<rate>/e<epochs>`` (the same at the chosen rate), ``seeds/<setting>/<form>/lr<rate>/
e<epochs>/s<seed>``, ``e2e/<setting>/spp`` (SPP end to end alone, with its recovery curve),
``then_e2e/<setting>/<form>/lr<rate>/e<epochs>`` (the reconstruction, then SPP end to end) and
``check/<setting>/<form>/lr<rate>/e<epochs>`` (the shorter check at another setting: Wanda 2:4's choice there). A job
is finished when its ``summary.json`` (``results.json``) exists; ``<dir>.running.log`` / ``<dir>.failed.log`` mark
one running or failed. What a run trained is read from its recorded config, its kind from its place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.recovery.records import TEST_SOURCE, VAL_SOURCE, eval_seconds, setting_of

TRAIN_KINDS = ("grid", "epochs", "seeds", "e2e", "then_e2e", "check")
RECONSTRUCTION_ALONE = ("grid", "epochs", "seeds", "check")
__all__ = ["TEST_SOURCE", "VAL_SOURCE", "Campaign", "Reference", "Run", "load", "recon_cpu_seconds"]


@dataclass(frozen=True)
class Run:
    """One ``train.py`` job: where it is, what it reconstructed and trained, what it measured."""

    rel: str
    kind: str
    setting: str
    form: str | None
    """The reconstruction's trainable form; ``None`` without reconstruction (``e2e``)."""
    lr: float | None
    epochs: int | None
    seed: int
    test: dict[str, Any]
    val: dict[str, Any] | None
    dense_test: dict[str, Any] | None
    pruned_test: dict[str, Any] | None
    recon_cpu_s: float | None
    """The reconstruction's process CPU seconds (the original run's on a cache hit); ``None`` without one."""
    cache_hit: bool
    total_s: float | None
    curve: list[dict[str, Any]] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def recon_min(self) -> float:
        """The reconstruction's CPU minutes (0 without one)."""
        return (self.recon_cpu_s or 0.0) / 60.0


@dataclass(frozen=True)
class Reference:
    """An ``eval.py`` reference: the dense model (``setting == "dense"``) or a setting's pruned model."""

    rel: str
    setting: str
    ppl: dict[str, dict[str, Any]]
    total_s: float | None
    machine: dict[str, Any] = field(default_factory=dict)


@dataclass
class Campaign:
    """Every finished job below the campaign directory, and the ones running or failed (by place)."""

    root: Path
    runs: list[Run]
    refs: list[Reference]
    pending: dict[str, str] = field(default_factory=dict)
    """``rel -> "running" | "failed"`` for jobs without a result file."""

    def reference(self, setting: str, source: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The dense and ``setting``'s pruned entries on ``source``; ``None`` until both are measured."""
        by = {r.setting: r.ppl.get(source) for r in self.refs}
        dense, pruned = by.get("dense"), by.get(setting)
        return (dense, pruned) if dense and pruned else None


def machine_of(run_dir: Path) -> dict[str, Any]:
    """A job's ``machine.json`` (``{}`` when absent)."""
    path = run_dir / "machine.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def recon_cpu_seconds(reconstruction: dict[str, Any] | None) -> float | None:
    """``reconstruction.timings.cpu_seconds``, or on a cache hit the original run's (``timings.original``)."""
    timings = (reconstruction or {}).get("timings") or {}
    value = timings.get("cpu_seconds", (timings.get("original") or {}).get("cpu_seconds"))
    return float(value) if value is not None else None


def load_run(path: Path, root: Path) -> Run:
    """Read ``path`` (a ``summary.json``) of a job below ``root``."""
    data = json.loads(path.read_text())
    rel = path.parent.relative_to(root)
    cfg, ppl = data["config"], data["perplexity"]
    rc = cfg.get("reconstruct") or {}
    recon = data.get("reconstruction") if rc.get("name", "none") != "none" else None
    return Run(rel=rel.as_posix(), kind=rel.parts[0],
               setting=setting_of(data["run"]["pruner"], data["run"]["sparsity"]),
               form=rc.get("form") if recon is not None else None,
               lr=float(rc["lr"] if rc.get("lr") is not None else recon["lr"]) if recon is not None else None,
               epochs=int(rc["epochs"]) if recon is not None else None, seed=int(cfg["seed"]), test=ppl["merged"],
               val=(data.get("merged_ppl_by_source") or {}).get(VAL_SOURCE), dense_test=ppl.get("dense"),
               pruned_test=ppl.get("pruned"), recon_cpu_s=recon_cpu_seconds(recon),
               cache_hit=bool((recon or {}).get("cache_hit")), total_s=(data.get("timings") or {}).get("total"),
               curve=list(data.get("recovery_curve") or []), blocks=list((recon or {}).get("blocks") or []),
               machine=machine_of(path.parent))


def load_reference(path: Path, root: Path) -> Reference:
    """Read ``path`` (an ``eval.py`` ``results.json`` under ``reference/``)."""
    rel = path.parent.relative_to(root)
    record = json.loads(path.read_text())["records"][0]
    return Reference(rel=rel.as_posix(), setting=rel.parts[1], ppl=record.get("ppl") or {},
                     total_s=eval_seconds(record), machine=machine_of(path.parent))


def pending_jobs(root: Path) -> dict[str, str]:
    """Jobs whose ``<dir>.running.log`` or ``<dir>.failed.log`` sits beside their directory."""
    out = {}
    for state in ("running", "failed"):
        for log in sorted(root.glob(f"*/**/*.{state}.log")):
            out[log.relative_to(root).as_posix().removesuffix(f".{state}.log")] = state
    return dict(sorted(out.items()))


def load(root: str | Path) -> Campaign:
    """Every finished job below ``root``, sorted by place.

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory: give the campaign directory "
                                "(experiments/results/runs/reconstruction)")
    runs = [load_run(p, root) for p in sorted(root.glob("*/**/summary.json"))
            if p.relative_to(root).parts[0] in TRAIN_KINDS]
    refs = [load_reference(p, root) for p in sorted(root.glob("reference/*/results.json"))]
    return Campaign(root=root, runs=runs, refs=refs, pending=pending_jobs(root))
