"""The training step the jobs run, rebuilt for timing: model, zero pattern, adapter, real Alpaca batches, AdamW.

``StepSetting`` holds what decides the cost of one step. Its defaults are the README main job (``python
train.py``: embedded SmolLM2-135M, 2:4, SPP r=16, dropout 0.05, batches of 8 Alpaca records cut at 128 tokens,
AdamW wd 0.001, fp32 on CPU); ``StepSetting.from_resolved_config`` reads them from a run's saved
``resolved_config.yaml`` with omegaconf alone (no Hydra composition, no ``spp.training`` import), so the timed
step is the one that run executed.

The zero pattern is applied by magnitude (``spp.pruning.pruners.magnitude``) whatever pruner the run used: Wanda and
magnitude give the same pattern *shape* (2:4, or the same unstructured ratio), and a dense fp32 product costs
the same whichever entries are zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from spp.data.alpaca import AlpacaDataModule
from spp.data.config import DataConfig
from spp.models.config import ModelConfig
from spp.models.loading import load_model
from spp.projections import DEFAULT_TARGETS, matches
from spp.pruning.config import SparsityConfig
from spp.pruning.pruners.magnitude import magnitude_mask

MAIN_JOB_DATA = {"max_examples": 120, "max_length": 128, "train_batch_size": 8}
"""The data keys that ``conf/budget/smollm2_135m.yaml`` sets for the main job (the rest are DataConfig defaults)."""


@dataclass
class StepSetting:
    """Everything that decides the cost of one training step (defaults: the README main job)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sparsity: SparsityConfig = field(default_factory=lambda: SparsityConfig(name="nm2_4", kind="nm", n=2, m=4))
    adapter_name: str = "spp"
    r: int = 16
    scale: float = 2.0
    dropout: float = 0.05
    impl: str = "fused"
    targets: tuple[str, ...] = DEFAULT_TARGETS
    data: DataConfig = field(default_factory=lambda: DataConfig(**MAIN_JOB_DATA))
    data_dir: str | None = None
    lr: float = 2e-2
    weight_decay: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    precision: str = "32-true"
    source: str = "defaults (README main job)"

    @classmethod
    def from_resolved_config(cls, path: str | Path) -> StepSetting:
        """Read the step of a run from its ``resolved_config.yaml`` (written by ``python train.py``).

        Raises:
            FileNotFoundError: ``path`` does not exist.
            KeyError: a section the step needs (``model``, ``sparsity``, ``adapter``, ``data``, ``trainer``) is
                missing, named in the message.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"--from-config {str(path)!r} does not exist; pass a run's resolved_config.yaml")
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        missing = [k for k in ("model", "sparsity", "adapter", "data", "trainer") if k not in cfg]
        if missing:
            raise KeyError(f"{path}: missing section(s) {missing}; is this a train.py resolved_config.yaml?")
        ad, tr = cfg["adapter"], cfg["trainer"]
        model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
        data_fields = {f.name for f in dataclasses.fields(DataConfig)}
        sp_fields = {f.name for f in dataclasses.fields(SparsityConfig)}
        precision = str(tr.get("precision", "auto"))
        return cls(
            model=ModelConfig(**{k: v for k, v in cfg["model"].items() if k in model_fields}),
            sparsity=SparsityConfig(**{k: v for k, v in cfg["sparsity"].items() if k in sp_fields}).validate(),
            adapter_name=str(ad.get("name", "spp")),
            r=int(ad.get("r", 16)),
            scale=float(ad.get("scale", 2.0)),
            dropout=float(ad.get("dropout", 0.05)),
            impl=str(ad.get("impl", "fused")),
            targets=tuple(ad.get("targets") or DEFAULT_TARGETS),
            data=DataConfig(**{k: v for k, v in cfg["data"].items() if k in data_fields}).validate(),
            data_dir=cfg.get("data_dir"),
            lr=float(tr.get("lr", 4e-3)),
            weight_decay=float(tr.get("weight_decay", 1e-3)),
            betas=tuple(float(b) for b in tr.get("betas", (0.9, 0.999))),  # type: ignore[arg-type]
            precision="32-true" if precision == "auto" else precision,
            source=str(path),
        )

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary for result files."""
        return {"source": self.source, "model": self.model.name, "model_path": self.model.path,
                "sparsity": self.sparsity.name, "adapter": self.adapter_name, "r": self.r, "scale": self.scale,
                "dropout": self.dropout, "impl": self.impl, "targets": list(self.targets),
                "batch_size": self.data.train_batch_size, "max_length": self.data.max_length,
                "max_examples": self.data.max_examples, "lr": self.lr, "weight_decay": self.weight_decay,
                "precision": self.precision}


@torch.no_grad()
def prune_(model: nn.Module, sparsity: SparsityConfig, targets: Iterable[str] = DEFAULT_TARGETS) -> int:
    """Zero the ``sparsity`` pattern into every target linear of ``model`` by magnitude; returns layers pruned."""
    targets = tuple(targets)
    count = 0
    if sparsity.kind == "dense":
        return 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and matches(name, targets):
            mod.weight.mul_(magnitude_mask(mod.weight, sparsity).to(mod.weight.dtype))
            count += 1
    return count


def load_pruned(setting: StepSetting) -> tuple[nn.Module, Any]:
    """The setting's model (fp32 on CPU unless ``model.torch_dtype`` says otherwise), pruned, with its tokenizer."""
    model, tokenizer = load_model(setting.model)
    prune_(model, setting.sparsity, setting.targets)
    return model, tokenizer


def training_batches(setting: StepSetting, tokenizer: Any, count: int | None = None) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` training batches the job's data module yields (epoch 0, its seeded shuffle)."""
    dm = AlpacaDataModule(tokenizer, setting.data, data_dir=setting.data_dir, progress=False)
    dm.setup("fit")
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(0)  # type: ignore[union-attr]
    out = []
    for batch in loader:
        out.append(batch)
        if count is not None and len(out) >= count:
            break
    return out


def make_step(model: nn.Module, batches: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]],
              lr: float = 1e-4, weight_decay: float = 0.0,
              betas: tuple[float, float] = (0.9, 0.999)) -> Callable[[], None]:
    """One optimisation step per call: forward with labels (causal-LM loss), backward, AdamW, ``zero_grad``.

    ``batches`` is one batch (repeated every call) or a list cycled through call by call.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas) if params else None
    seq = [batches] if isinstance(batches, dict) else list(batches)
    state = {"i": 0}

    def step() -> None:
        batch = seq[state["i"] % len(seq)]
        state["i"] += 1
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def batch_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Non-padding tokens of a batch (what ``train/tokens_per_s`` counts)."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())
