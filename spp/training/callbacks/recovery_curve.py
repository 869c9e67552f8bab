"""``RecoveryCurve``: the merged model's WikiText-2 validation perplexity along one training run, against the
training CPU time so far (``trainer.curve_every_n_steps``). Each point measures the model as the export merges it
(:meth:`~spp.adapters.base.AdapterMethod.merged_layer`), then restores the layers, RNG state and train/eval modes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import nn

from spp.adapters.base import AdapterMethod, set_submodule
from spp.atomic import write_json_atomic
from spp.errors import UserError
from spp.eval.config import EvalConfig
from spp.eval.perplexity import WIKITEXT2_VAL, PerplexityResult, Windows, eval_windows, result_from_sums, score_windows
from spp.export.merged import hf_model, plain_name
from spp.training.callbacks.rng_state import rng_states, set_rng_states
from spp.training.config import TrainJobConfig

log = logging.getLogger(__name__)

CURVE_FILE = "recovery_curve.json"
"""The curve's file in the run directory (rewritten atomically after every point)."""
CURVE_METRIC = "curve/ppl_merged"
"""The logged metric of each point: the merged model's ``wikitext2_val`` perplexity."""


class MergedLinear(nn.Module):
    """A plain linear layer holding one adapted layer's merged tensors (``weight``, optional ``bias``)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.weight = nn.Parameter(tensors["weight"], requires_grad=False)
        self.bias = nn.Parameter(tensors["bias"], requires_grad=False) if "bias" in tensors else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@contextmanager
def merged_view(model: nn.Module, method: AdapterMethod, masks: Mapping[str, torch.Tensor]) -> Iterator[nn.Module]:
    """``model``'s Hugging Face model with each adapted layer swapped for its merged plain layer (the export's
    :meth:`~spp.adapters.base.AdapterMethod.merged_layer`); the original layers are put back on exit."""
    hf = hf_model(model)
    swapped: list[tuple[str, nn.Module]] = []
    try:
        with torch.no_grad():
            for name, module in list(hf.named_modules()):
                if not name or any(name.startswith(done + ".") for done, _ in swapped):
                    continue
                key = plain_name(name)
                merged = method.merged_layer(module, masks[key] if key in masks else None)
                if merged is not None:
                    set_submodule(hf, name, MergedLinear(merged.tensors))
                    swapped.append((name, module))
        yield hf
    finally:
        for name, module in reversed(swapped):
            set_submodule(hf, name, module)


class RecoveryCurve(Callback):
    """Measure the merged model's ``wikitext2_val`` perplexity every ``every`` optimiser steps into ``path``."""

    def __init__(self, path: Path, every: int, eval_cfg: EvalConfig, tokenizer: Any, method: AdapterMethod,
                 data_dir: str | None = None) -> None:
        self.path = Path(path)
        self.every = int(every)
        self.eval_cfg = eval_cfg
        self.tokenizer = tokenizer
        self.method = method
        self.data_dir = data_dir
        self.points: list[dict[str, Any]] = []
        self.cpu_s = self.wall_s = 0.0
        self._batch_start: tuple[float, float] | None = None
        self._windows: Windows | None = None

    @property
    def last_step(self) -> int | None:
        """The step of the last point (``None`` before the first)."""
        return self.points[-1]["step"] if self.points else None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Refuse more than one process before anything is loaded (the callback runs before the pruning one)."""
        if trainer.world_size > 1:
            raise UserError.from_message(
                f"trainer.curve_every_n_steps={self.every} needs one process (trainer.devices=1): this job runs "
                f"{trainer.world_size}; set trainer.devices=1 trainer.num_nodes=1 or trainer.curve_every_n_steps=null")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The first point (step 0, or the resumed step after the points the interrupted run wrote)."""
        if trainer.global_step > 0 and self.path.is_file():
            old = json.loads(self.path.read_text()).get("points", [])
            self.points = [p for p in old if p["step"] <= trainer.global_step]
            if self.points:
                self.cpu_s, self.wall_s = self.points[-1]["train_cpu_s"], self.points[-1]["train_wall_s"]
        if self.last_step != trainer.global_step:
            self.measure(trainer, pl_module)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._batch_start = (time.process_time(), time.perf_counter())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._batch_start is not None:
            cpu, wall = self._batch_start
            self.cpu_s += time.process_time() - cpu
            self.wall_s += time.perf_counter() - wall
            self._batch_start = None
        step = trainer.global_step
        if step != self.last_step and step % self.every == 0:
            self.measure(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The last point, unless the last step was just measured."""
        if trainer.global_step != self.last_step:
            self.measure(trainer, pl_module)

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """One point: the merged model's perplexity now; random state and train/eval modes as they were."""
        start = time.perf_counter()
        states = rng_states()
        modes = [(m, m.training) for m in pl_module.modules()]
        try:
            with merged_view(pl_module.model, self.method, getattr(pl_module, "masks", None) or {}) as merged:
                result = self._perplexity(merged)
        finally:
            for module, training in modes:
                module.training = training
            set_rng_states(states)
        seconds = time.perf_counter() - start
        point = {"step": int(trainer.global_step), "train_cpu_s": self.cpu_s, "train_wall_s": self.wall_s,
                 **result.to_dict(), "measure_s": round(seconds, 3)}
        self.points.append(point)
        write_json_atomic(self.path, self.record())
        log.info("recovery curve: step %d, %.3f training CPU-min, merged %s perplexity %.4f (measured in %.1f s)",
                 point["step"], self.cpu_s / 60, WIKITEXT2_VAL, result.ppl, seconds)
        for logger in trainer.loggers:  # charted over steps (W&B) beside train/loss
            logger.log_metrics({CURVE_METRIC: result.ppl}, step=point["step"])
        return point

    def _perplexity(self, model: nn.Module) -> PerplexityResult:
        """``spp.eval.perplexity.perplexity``'s steps on the final evaluation's ``wikitext2_val`` windows (read and
        tokenized once)."""
        cfg = self.eval_cfg
        if self._windows is None:
            self._windows = eval_windows(self.tokenizer, WIKITEXT2_VAL, int(cfg.seqlen), cfg.max_windows,
                                         int(cfg.batch_size), self.data_dir, cfg.window_sampling, model)
        batches = range(len(self._windows.batches(int(cfg.batch_size))))
        device = next(model.parameters()).device
        sums = score_windows(model, self._windows, int(cfg.batch_size), batches, device, quiet=True)
        return result_from_sums(sums, self._windows)

    def record(self) -> dict[str, Any]:
        """What ``recovery_curve.json`` holds."""
        return {"source": WIKITEXT2_VAL, "every_n_steps": self.every, "adapter": self.method.name,
                "points": self.points}


def curve_callbacks(job: TrainJobConfig, run_dir: Path, tokenizer: Any, method: AdapterMethod) -> list[Callback]:
    """``[RecoveryCurve]`` when ``trainer.curve_every_n_steps`` is set, else ``[]`` (the config was checked when the
    job was built: ``TrainJobConfig.__post_init__``; the process count the machine decides, in ``setup``)."""
    every = job.trainer.curve_every_n_steps
    if every is None:
        return []
    return [RecoveryCurve(run_dir / CURVE_FILE, every, job.eval, tokenizer, method, job.data_dir)]
