"""``ExportCallback``: at fit end merge the adapter, audit the zeros, evaluate, and write the sparse model."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from spp.adapters import AdapterConfig, get_method, merge_adapter
from spp.atomic import write_dir_atomic
from spp.training.callbacks.sparsity_audit import audit
from spp.training.ppl_cache import ppl_settings


class ExportCallback(L.Callback):
    """Merge → audit → evaluate → export on global rank 0 (other ranks wait at a barrier).

    Writes ``<run_dir>/adapter`` (``adapter_config.json`` + ``adapter_model.safetensors``) and
    ``<run_dir>/merged`` (``save_pretrained`` model + tokenizer), each folder atomically.

    Args:
        run_dir: Output directory of the job.
        tokenizer: Saved beside the merged model.
        adapter_cfg: The ``adapter`` group (mapping).
        masks: Callable returning the pruning masks (True = kept).
        reference_zeros: Callable returning the zero pattern recorded at fit start (or ``None``).
        eval_cfg: The ``eval`` group (perplexity; zero-shot tasks when listed).
        data_dir: Data root override.
        export_merged: Write the merged model.
        export_adapter: Write the adapter files.
        max_shard_size: ``save_pretrained`` shard size.
        rebuild: For sharded strategies: returns an unwrapped adapted model to load the gathered state into.
        adapter_extra: Extra entries for ``adapter_config.json`` (pruning provenance).
    """

    def __init__(
        self,
        run_dir: str | Path,
        tokenizer: Any,
        adapter_cfg: dict[str, Any],
        masks: Callable[[], dict[str, torch.Tensor]],
        reference_zeros: Callable[[], dict[str, torch.Tensor] | None],
        eval_cfg: Any = None,
        data_dir: str | None = None,
        export_merged: bool = True,
        export_adapter: bool = True,
        max_shard_size: str = "5GB",
        rebuild: Callable[[], nn.Module] | None = None,
        adapter_extra: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.tokenizer = tokenizer
        self.adapter_cfg = adapter_cfg
        self._masks, self._reference = masks, reference_zeros
        self.eval_cfg, self.data_dir = eval_cfg, data_dir
        self.export_merged, self.export_adapter = export_merged, export_adapter
        self.max_shard_size = max_shard_size
        self.rebuild = rebuild
        self.adapter_extra = adapter_extra or {}
        self.results: dict[str, Any] = {}

    def _local_model(self, trainer: L.Trainer, pl_module: L.LightningModule) -> nn.Module:
        """The full adapted model on this rank (gathered for sharded strategies)."""
        from spp.training.strategies import is_sharded

        if not is_sharded(trainer.strategy):
            return pl_module.model
        state = trainer.strategy.lightning_module_state_dict()
        if not trainer.is_global_zero:
            return pl_module.model
        if self.rebuild is None:
            raise RuntimeError("a sharded strategy needs ExportCallback(rebuild=...) to export the gathered model")
        model = self.rebuild()
        inner = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
        model.load_state_dict(inner, strict=False)
        return model

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Run the export on rank 0, then a barrier so no rank tears down before the files exist."""
        model = self._local_model(trainer, pl_module)
        if trainer.is_global_zero:
            self.results = self.export(model, device=trainer.strategy.root_device)
        trainer.strategy.barrier("spp_export")

    def export(self, model: nn.Module, device: torch.device | None = None) -> dict[str, Any]:
        """Merge, audit, evaluate and write; returns what the summary reports."""
        out: dict[str, Any] = {}
        timings: dict[str, float] = {}
        model.eval()
        cfg = AdapterConfig(**self.adapter_cfg)
        method = get_method(cfg.name)
        if self.export_adapter and method.trains:
            start = time.perf_counter()
            path = write_dir_atomic(self.run_dir / "adapter", lambda tmp: method.save(model, tmp, self.adapter_extra))
            out["adapter_dir"] = str(path)
            timings["save_adapter"] = round(time.perf_counter() - start, 2)
        start = time.perf_counter()
        merged, merge_stats = merge_adapter(model, cfg, self._masks())
        timings["merge"] = round(time.perf_counter() - start, 2)
        out["merge_stats"] = merge_stats
        # LoRA* may legitimately fill kept weights that happened to be exactly zero (e.g. quantized GGUF weights);
        # only pruned positions must stay zero. SPP multiplies the weight, so its zeros cannot move at all.
        out["audit_merged"] = audit(
            merged, self._masks(), self._reference(), when="merged",
            kept_zeros_may_change=self.adapter_cfg["name"] == "lora",
        )
        self.merged_model = merged
        if self.eval_cfg is not None and self.eval_cfg.ppl:
            from spp.eval.perplexity import perplexity

            start = time.perf_counter()
            settings = ppl_settings(self.eval_cfg)
            res = perplexity(merged, self.tokenizer, data_dir=self.data_dir, device=device, **settings)
            out["ppl_merged"] = {**res.to_dict(), "seconds": round(time.perf_counter() - start, 2)}
        if self.eval_cfg is not None and list(self.eval_cfg.tasks):
            start = time.perf_counter()
            out["zero_shot"] = _zero_shot(merged, self.tokenizer, self.eval_cfg, self.data_dir)
            timings["zero_shot"] = round(time.perf_counter() - start, 2)
        if self.export_merged:
            start = time.perf_counter()
            merged_cpu_dtype = next(merged.parameters()).dtype

            def _write(tmp: Path) -> None:
                merged.save_pretrained(tmp, max_shard_size=self.max_shard_size)
                self.tokenizer.save_pretrained(tmp)
                (tmp / "spp_export.json").write_text(
                    json.dumps({"adapter": self.adapter_cfg, "dtype": str(merged_cpu_dtype), **self.adapter_extra},
                               indent=2, default=str)
                )

            out["merged_dir"] = str(write_dir_atomic(self.run_dir / "merged", _write))
            timings["save_merged"] = round(time.perf_counter() - start, 2)
        out["timings"] = timings
        return out


def _zero_shot(model: nn.Module, tokenizer: Any, eval_cfg: Any, data_dir: str | None) -> dict[str, Any]:
    """Run the lm-eval tasks of ``eval.tasks`` (e.g. ``spp_zeroshot``) through ``spp.eval.harness``."""
    from spp.eval.harness import run_eval_tasks

    result = run_eval_tasks(model, tokenizer, eval_cfg, data_dir)
    return {"metrics": result.metrics, "zero_shot_mean": result.zero_shot_mean, "mmlu_acc": result.mmlu_acc,
            "limit": result.limit, "mmlu_limit": getattr(eval_cfg, "mmlu_limit", None),
            "num_fewshot": result.num_fewshot}
