"""The architecture matrix: which families work end to end, cell by cell, on tiny random models.

One cell = (family, pruner, pattern, adapter): prune the family's tiny model (``spp.models.tiny``) -> the training
adapter -> a few AdamW steps -> streamed export (merge + audit) -> every pruned weight still zero in the files ->
reload with ``AutoModelForCausalLM`` -> logits equal to the in-memory merged model's. :data:`CELLS` is pairwise,
not the full product: each family meets every pruner, every training adapter and both patterns.

``tests/test_architectures.py`` runs every cell; ``benchmarks/architectures.py`` runs them too and writes
``docs/results/architectures.json`` and the README's "Supported models" table (:func:`supported_table`).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import torch

from spp.models.tiny import TINY_FAMILIES

FAMILIES: list[str] = list(TINY_FAMILIES)
PRUNERS: list[str] = ["magnitude", "wanda", "sparsegpt", "dsnot"]
ADAPTERS: list[str] = ["spp", "lora", "sparse_lora", "masked_full", "scale_lora", "norms", "losa"]
PATTERNS: tuple[str, ...] = ("unstructured50", "nm2_4")
EXAMPLES: dict[str, str] = {
    "llama": "LLaMA-1/2, Llama-3.x (GQA, rope scaling), SmolLM2",
    "qwen2": "Qwen2, Qwen2.5 (q/k/v biases)",
    "qwen3": "Qwen3 (q/k norms; sliding and full attention mixed)",
    "mistral": "Mistral (sliding window)",
    "gemma2": "Gemma-2 (tied embeddings, soft-capping, extra norms)",
    "phi3": "Phi-3 (fused qkv_proj, gate_up_proj)",
    "opt": "OPT (fc1/fc2, biases, ReLU)",
    "gpt2": "GPT-2 (Conv1D projections, stored transposed)",
}
"""What each tiny family stands for (its quirks are on in :data:`spp.models.tiny.TINY_FAMILIES`)."""

GROUPS: dict[str, list[str]] = {
    "llama": ["llama7b", "llama13b", "llama30b", "llama65b", "llama2_7b", "llama2_13b", "llama2_70b", "llama3_1_8b",
              "smollm2_135m", "tiny"],
    "qwen2": ["qwen2_5_7b", "tiny_qwen2"], "qwen3": ["tiny_qwen3"], "mistral": ["mistral_7b", "tiny_mistral"],
    "gemma2": ["gemma2_9b", "tiny_gemma2"], "phi3": ["tiny_phi3"], "opt": ["tiny_opt"], "gpt2": ["tiny_gpt2"],
}
"""``conf/model/`` groups per family (a test checks each exists)."""

ADAPTER_SETTINGS: dict[str, dict[str, Any]] = {
    "spp": {"r": 16, "dropout": 0.0}, "lora": {"r": 8, "dropout": 0.0}, "sparse_lora": {"r": 8, "dropout": 0.0},
    "masked_full": {}, "scale_lora": {"r": 8}, "norms": {}, "losa": {"r": 8, "dropout": 0.0},
}
CALIBRATION_SETTINGS: dict[str, int] = {"nsamples": 4, "seqlen": 48, "batch_size": 2}
"""Calibration of the cells: 48 tokens, longer than the tiny sliding windows (32), so the windows matter."""


def _cells() -> list[tuple[str, str, str, str]]:
    cells = []
    for f, family in enumerate(FAMILIES):
        for a, adapter in enumerate(ADAPTERS):
            cells.append((family, PRUNERS[(a + f) % len(PRUNERS)], PATTERNS[(a + f // 2) % 2], adapter))
    return cells


CELLS: list[tuple[str, str, str, str]] = _cells()
"""(family, pruner, pattern, adapter): per family one cell per training adapter, the pruner and the pattern rotating
with the family so that each family meets all four pruners and both patterns, and each (pruner, pattern) pair
occurs."""


def _tokens(seed: int, n: int = 2, length: int = 40) -> torch.Tensor:
    return torch.randint(4, 260, (n, length), generator=torch.Generator().manual_seed(seed))


def train_steps(model: torch.nn.Module, steps: int = 3, lr: float = 1e-2) -> list[float]:
    """A few AdamW steps on random tokens (lr large enough to move LoRA's B off zero); returns the losses."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    model.train()
    for step in range(steps):
        ids = _tokens(step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
        opt.zero_grad()
    model.eval()
    return losses


def _pruned(family: str, pruner: str, pattern: str, data_dir: str) -> tuple[torch.nn.Module, Any]:
    from spp.models.tiny import tiny_model, tiny_tokenizer
    from spp.pruning.config import CalibrationConfig, PrunerConfig, SparsityConfig
    from spp.pruning.engine import prune_model

    sparsity = (SparsityConfig(name=pattern, kind="nm", n=2, m=4) if pattern == "nm2_4"
                else SparsityConfig(name=pattern, kind="unstructured", ratio=0.5))
    model = tiny_model(seed=1, model_type=family)
    result = prune_model(model, tiny_tokenizer(), PrunerConfig(name=pruner), sparsity,
                         CalibrationConfig(**CALIBRATION_SETTINGS), data_dir=data_dir, device="cpu")
    return model, result


def _zeros_in_files(directory: Path, masks: Any, transposed: bool) -> int:
    """Checks every pruned weight is zero in the exported files; returns the layers checked."""
    from safetensors import safe_open

    files: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            files.update({k: fh.get_tensor(k) for k in fh.keys()})
    for name in masks:
        keep, weight = masks[name], files[f"{name}.weight"]
        weight = weight.t() if transposed else weight  # GPT-2's Conv1D layout [in, out] in the files
        if weight.shape != keep.shape or not bool((weight[~keep] == 0).all()):
            raise AssertionError(f"{name}: a pruned weight is non-zero in the export")
    return len(masks)


def run_cell(family: str, pruner: str, pattern: str, adapter: str, out: Path, data_dir: str) -> dict[str, Any]:
    """One cell (see the module docstring); raises ``AssertionError`` naming what broke. Returns its record."""
    from transformers import AutoModelForCausalLM

    from spp.adapters import apply_adapter, get_method, make_config
    from spp.distributed import DistContext
    from spp.export.manifest import ExportManifest, adapter_record
    from spp.export.merged import ExportInputs, export_streamed
    from spp.models.tiny import tiny_tokenizer

    t0 = time.perf_counter()
    model, result = _pruned(family, pruner, pattern, data_dir)
    cfg = make_config(adapter, **ADAPTER_SETTINGS[adapter])
    torch.manual_seed(0)
    adapted, trainable = apply_adapter(model, cfg, result.masks)
    before = {n: p.detach().clone() for n, p in adapted.named_parameters() if p.requires_grad}
    losses = train_steps(adapted)
    if not any(not torch.equal(p, before[n]) for n, p in adapted.named_parameters() if p.requires_grad):
        raise AssertionError("training moved no adapter tensor")
    method = get_method(adapter)
    manifest = ExportManifest(adapter=adapter_record(cfg), dtype="torch.float32",
                              pruning={"model": f"tiny_{family}", "pruner": pruner, "sparsity": pattern})
    inputs = ExportInputs(method, result.zeros, tiny_tokenizer(), manifest)
    export_streamed(adapted, inputs, out, DistContext(device=torch.device("cpu")))
    merged, _ = method.merge(copy.deepcopy(adapted), cfg, result.masks)
    layers = _zeros_in_files(out, result.masks, transposed=family == "gpt2")
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        ids = _tokens(99, length=48)
        diff = float((reloaded(input_ids=ids).logits - merged(input_ids=ids).logits).abs().max())
    if type(reloaded) is not type(merged) or diff > 1e-5:
        raise AssertionError(f"the reloaded export's logits differ from the merged model's by {diff:.2e}")
    audit = json.loads((out / "spp_export.json").read_text())["audit"]
    return {"family": family, "pruner": pruner, "pattern": pattern, "adapter": adapter, "ok": True,
            "pruned_layers": layers, "trainable": len(trainable), "loss_first": losses[0], "loss_last": losses[-1],
            "export_sparsity": audit["sparsity"], "max_logit_diff": diff,
            "seconds": round(time.perf_counter() - t0, 2)}


MARK = "✔"


def supported_table(records: list[dict[str, Any]]) -> str:
    """The README's "Supported models" table from the cell records (``ok`` or the one-line ``error``)."""
    head = ("| family | stands for | pruners | adapters (trained, merged, exported, reloaded) | model groups |\n"
            "|---|---|---|---|---|\n")
    rows = []
    for family in FAMILIES:
        mine = [r for r in records if r["family"] == family]
        failed = [r for r in mine if not r["ok"]]
        pruners = ", ".join(sorted({r["pruner"] for r in mine if r["ok"]}, key=PRUNERS.index))
        adapters = ", ".join(sorted({r["adapter"] for r in mine if r["ok"]}, key=ADAPTERS.index))
        patterns = "/".join(sorted({r["pattern"] for r in mine if r["ok"]}, key=PATTERNS.index))
        status = MARK if not failed and mine else "✘ " + "; ".join(f"{r['adapter']}: {r['error']}" for r in failed)
        rows.append(f"| {family} {status} | {EXAMPLES[family]} | {pruners} ({patterns}) | {adapters} | "
                    f"{', '.join(f'`{g}`' for g in GROUPS[family])} |\n")
    return head + "".join(rows)
