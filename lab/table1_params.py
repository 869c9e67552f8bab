"""Parameter accounting of paper Table 1: ``python -m lab.table1_params [--r 16] [--models llama7b ...]``.

Each architecture is built on the meta device (no memory, nothing downloaded) from the ``arch`` block of
``conf/model/<name>.yaml`` and injected with SPP; a layer with an m x n weight adds ``m + r n`` parameters.

A second table compares every registered adapter method that trains on the same models (``--methods``,
``--lora-r``, ``--sparsity``): each is injected by its own code and asked what it trains
(:meth:`~spp.adapters.base.AdapterMethod.trained_parameters`): ``spp`` ``m + r n`` per layer; ``lora`` = LoRA*,
``sparse_lora`` = SparsePEFT and ``scale_lora`` = ScaleLoRA ``r (m + n)``; ``masked_full`` the kept weights of the
adapted projections, ``(1 - sparsity) m n`` per layer; ``norms`` the normalisation weights (and biases).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, PreTrainedConfig

from lab.labels import trained_methods
from spp.adapters.base import count_parameters
from spp.adapters.registry import get_method, make_config
from spp.paths import CONF_DIR
from spp.projections import DEFAULT_TARGETS

TABLE1_MODELS: tuple[str, ...] = ("llama7b", "llama13b", "llama30b", "llama65b", "llama2_7b", "llama2_13b",
                                  "llama2_70b")


@dataclass(frozen=True)
class ParamCount:
    """One row of Table 1: trainable SPP parameters, all parameters (base + SPP) and their ratio in per mille.

    For the other methods ``trainable`` is what the method trains (masked full: the kept weights) and ``total``
    the base model plus the method's added parameters.
    """

    model: str
    r: int
    trainable: int
    total: int
    method: str = "spp"

    @property
    def per_mille(self) -> float:
        return 1000.0 * self.trainable / self.total


def model_arch(name: str, conf_dir: Path = CONF_DIR) -> PreTrainedConfig:
    """The config of the ``arch`` block of ``conf/model/<name>.yaml`` (its ``model_type``; LLaMA when absent)."""
    path = Path(conf_dir) / "model" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (Path(conf_dir) / "model").glob("*.yaml"))
        raise FileNotFoundError(f"No model config {path}; known models: {known}.")
    arch = OmegaConf.to_container(OmegaConf.load(path).get("arch") or {})
    if not arch:
        raise ValueError(f"{path} has an empty 'arch' block; add the config.json fields (hidden_size, ...).")
    model_type = arch.pop("model_type", "llama")
    return LlamaConfig(**arch) if model_type == "llama" else AutoConfig.for_model(model_type, **arch)


def count_spp_parameters(name: str, r: int = 16, targets: tuple[str, ...] = DEFAULT_TARGETS) -> ParamCount:
    """Build ``name`` on the meta device, inject SPP with rank ``r`` and count parameters."""
    return count_method_parameters(name, "spp", r=r, targets=targets)


def count_method_parameters(name: str, method: str, r: int | None = 16, sparsity: float = 0.5,
                            targets: tuple[str, ...] = DEFAULT_TARGETS) -> ParamCount:
    """Trainable parameters of ``method`` on ``name`` (built on the meta device and injected by the method's code).

    Args:
        name: ``conf/model/<name>.yaml``.
        method: A registered adapter method that trains.
        r: The method's ``r`` (SPP rows of alpha, the LoRA / SparsePEFT / ScaleLoRA rank); ignored by a method
            without one (reported as 0).
        sparsity: Pruned fraction of the adapted projections (``masked_full`` trains the rest); 0.5 for 2:4.
    """
    if method not in trained_methods():
        raise ValueError(f"method {method!r}: use one of {list(trained_methods())}")
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity={sparsity} must be in [0, 1)")
    impl = get_method(method)
    has_r = "r" in {f.name for f in dataclasses.fields(impl.config_class)}
    cfg = make_config(method, targets=list(targets), **({"r": r} if has_r and r is not None else {}))
    with torch.device("meta"):
        model = impl.inject(AutoModelForCausalLM.from_config(model_arch(name)), cfg, {})
    trained = impl.trained_parameters(model, sparsity)
    total = count_parameters(model).total
    return ParamCount(model=name, r=impl.rank(cfg) or 0, trainable=trained, total=total, method=method)


def methods_table(rows: list[ParamCount]) -> str:
    """The method comparison as Markdown: model, method, r, trainable, all parameters, per mille."""
    lines = ["| model | method | r | trainable | all | ‰ |", "|---|---|---|---|---|---|"]
    for row in rows:
        r = str(row.r) if row.r else "-"
        lines.append(f"| {row.model} | {row.method} | {r} | {row.trainable:.1e} | {row.total:.1e} | "
                     f"{row.per_mille:.2f} |")
    return "\n".join(lines)


def markdown_table(rows: list[ParamCount]) -> str:
    """Table 1 as Markdown: model, r, trainable, all parameters, per mille."""
    lines = ["| model | r | trainable | all | ‰ |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.model} | {row.r} | {row.trainable:.1e} | {row.total:.1e} | {row.per_mille:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print Table 1 for the requested models (default: the seven LLaMA models), then the method comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--r", type=int, default=16, help="SPP rank r (rows of alpha); default 16")
    parser.add_argument("--models", nargs="+", default=list(TABLE1_MODELS), help="conf/model/<name>.yaml names")
    parser.add_argument("--methods", nargs="*", default=list(trained_methods()), choices=trained_methods(),
                        help="methods of the second table (none: Table 1 only)")
    parser.add_argument("--lora-r", type=int, default=8,
                        help="rank of the other methods with an r (LoRA*, SparsePEFT, ScaleLoRA); default 8")
    parser.add_argument("--sparsity", type=float, default=0.5, help="pruned fraction for masked_full; default 0.5")
    args = parser.parse_args(argv)
    print(markdown_table([count_spp_parameters(m, r=args.r) for m in args.models]))
    if args.methods:
        rows = [count_method_parameters(m, meth, r=args.r if meth == "spp" else args.lora_r, sparsity=args.sparsity)
                for m in args.models for meth in args.methods]
        print()
        print(methods_table(rows))


if __name__ == "__main__":
    main()
