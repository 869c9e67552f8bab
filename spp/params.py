"""Parameter accounting of paper Table 1: ``python -m spp.params [--r 16] [--models llama7b ...]``.

Each architecture is built on the meta device (no memory, nothing downloaded) from the ``arch`` block of
``conf/model/<name>.yaml`` and injected with SPP; a layer with an m x n weight adds ``m + r n`` parameters.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from spp.adapters.base import count_parameters
from spp.adapters.spp.model import inject
from spp.paths import CONF_DIR
from spp.projections import DEFAULT_TARGETS

TABLE1_MODELS: tuple[str, ...] = ("llama7b", "llama13b", "llama30b", "llama65b", "llama2_7b", "llama2_13b",
                                  "llama2_70b")


@dataclass(frozen=True)
class ParamCount:
    """One row of Table 1: trainable SPP parameters, all parameters (base + SPP) and their ratio in per mille."""

    model: str
    r: int
    trainable: int
    total: int

    @property
    def per_mille(self) -> float:
        return 1000.0 * self.trainable / self.total


def model_arch(name: str, conf_dir: Path = CONF_DIR) -> LlamaConfig:
    """``LlamaConfig`` from the ``arch`` block of ``conf/model/<name>.yaml``."""
    path = Path(conf_dir) / "model" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (Path(conf_dir) / "model").glob("*.yaml"))
        raise FileNotFoundError(f"No model config {path}; known models: {known}.")
    arch = OmegaConf.to_container(OmegaConf.load(path).get("arch") or {})
    if not arch:
        raise ValueError(f"{path} has an empty 'arch' block; add the LlamaConfig fields (hidden_size, ...).")
    return LlamaConfig(**arch)


def count_spp_parameters(name: str, r: int = 16, targets: tuple[str, ...] = DEFAULT_TARGETS) -> ParamCount:
    """Build ``name`` on the meta device, inject SPP with rank ``r`` and count parameters."""
    config = model_arch(name)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
        inject(model, targets=targets, r=r)
    counts = count_parameters(model)
    return ParamCount(model=name, r=r, trainable=counts.trainable, total=counts.total)


def markdown_table(rows: list[ParamCount]) -> str:
    """Table 1 as Markdown: model, r, trainable, all parameters, per mille."""
    lines = ["| model | r | trainable | all | ‰ |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.model} | {row.r} | {row.trainable:.1e} | {row.total:.1e} | {row.per_mille:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the Markdown table for the requested models (default: the seven LLaMA models of Table 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--r", type=int, default=16, help="SPP rank r (rows of alpha); default 16")
    parser.add_argument("--models", nargs="+", default=list(TABLE1_MODELS), help="conf/model/<name>.yaml names")
    args = parser.parse_args(argv)
    print(markdown_table([count_spp_parameters(m, r=args.r) for m in args.models]))


if __name__ == "__main__":
    main()
