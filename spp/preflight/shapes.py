"""Shape rules checked against the model's arch fields before any weight is loaded: the adapter method's own
(:meth:`~spp.adapters.base.AdapterMethod.preflight`), N:M's ``m | in_features``, the sequence lengths, and the
``*.targets`` against the layers of the architecture built on the meta device."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from spp.adapters.registry import get_method
from spp.errors import UserError
from spp.projections import DEFAULT_TARGETS, matches

log = logging.getLogger(__name__)


def linear_shapes(arch: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of the seven projections of a LLaMA decoder block, from its arch fields."""
    hidden, inter = int(arch["hidden_size"]), int(arch["intermediate_size"])
    heads = int(arch["num_attention_heads"])
    kv = int(arch.get("num_key_value_heads") or heads)
    head_dim = int(arch.get("head_dim") or hidden // heads)
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv * head_dim), "v_proj": (hidden, kv * head_dim),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def _targets(targets: list[str]) -> list[str]:
    return [p for p in DEFAULT_TARGETS if matches(f"model.layers.0.{p}", targets) or p in targets]


def check_shapes(arch: dict[str, Any], *, adapter: Any = None, sparsity: Any = None, pruner: Any = None,
                 seqlens: dict[str, int] | None = None) -> None:
    """Every shape rule of the run against the arch: the adapter method's own (:meth:`~spp.adapters.base.
    AdapterMethod.preflight`, e.g. SPP's ``r | out_features``), N:M's ``m | in_features``, the sequence lengths
    within ``max_position_embeddings``."""
    max_pos = arch.get("max_position_embeddings")
    for key, value in (seqlens or {}).items():
        if max_pos is not None and value > int(max_pos):
            raise UserError(f"{key}={value} exceeds the model's max_position_embeddings={max_pos}",
                            f"set {key}<={max_pos}", key=key)
    if not {"hidden_size", "intermediate_size", "num_attention_heads"} <= set(arch):
        if adapter is not None:
            get_method(adapter.name).preflight(adapter, None)
        log.info("preflight: the model's shapes are unknown before loading (hub id without model.arch); "
                 "shape checks run after loading")
        return
    shapes = linear_shapes(arch)
    if adapter is not None:  # the method's own rules (SPP: r divides every out_features)
        get_method(adapter.name).preflight(adapter, {p: shapes[p] for p in _targets(list(adapter.targets))})
    if sparsity is not None and pruner is not None and sparsity.kind == "nm" and pruner.name != "none":
        m = int(sparsity.m)
        bad = {p: shapes[p][0] for p in _targets(list(pruner.targets)) if shapes[p][0] % m}
        if bad:
            name, inp = next(iter(bad.items()))
            raise UserError(f"sparsity.m={m} does not divide in_features={inp} of {name} (N:M groups run along the "
                            "input dimension)", f"choose sparsity.m dividing {inp}, or drop {name} from "
                            "pruner.targets", key="sparsity.m")


@dataclass(frozen=True)
class ArchLayers:
    """The weight layers of an architecture, read from a one-block copy built on the meta device.

    Attributes:
        linears: Qualified names of every ``nn.Linear`` of the model (``lm_head`` included).
        block_linears: Leaf names of the ``nn.Linear`` layers of a decoder block (what ``pruner.targets`` names).
        block_others: The block's other 2-D weight layers as ``"<leaf> (<class>)"`` (GPT-2's ``Conv1D``).
    """

    linears: list[str]
    block_linears: list[str]
    block_others: list[str]


def arch_layers(arch: dict[str, Any]) -> ArchLayers | None:
    """The layers of the architecture ``arch`` (its ``config.json`` fields, ``model_type`` included), from a copy
    with one decoder block built on the meta device: no weight is read or allocated.

    Returns ``None`` when ``arch`` names no ``model_type`` or transformers cannot build it (the layers are then
    checked at load time).
    """
    model_type = arch.get("model_type")
    if not model_type:
        return None
    try:
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM

        from spp.pruning.targets import decoder_layers

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # config warnings belong to load time, not to this check
        try:
            config = AutoConfig.for_model(model_type, **{k: v for k, v in arch.items() if k != "model_type"})
            config.num_hidden_layers = 1
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
        finally:
            transformers.logging.set_verbosity(verbosity)
        _, layers = decoder_layers(model)
    except Exception as err:  # noqa: BLE001 - an architecture transformers cannot build fails at load time instead
        log.info("preflight: cannot build model_type=%s on the meta device (%s); layer checks run after loading",
                 model_type, err)
        return None
    block = list(layers[0].named_modules())
    return ArchLayers(
        linears=[n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)],
        block_linears=sorted({n.rsplit(".", 1)[-1] for n, m in block if isinstance(m, torch.nn.Linear)}),
        block_others=sorted({f"{n.rsplit('.', 1)[-1]} ({type(m).__name__})" for n, m in block
                             if not isinstance(m, (torch.nn.Linear, torch.nn.Embedding))
                             and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2}),
    )


def check_targets(arch: dict[str, Any], path: str, *, pruner: Any = None, sparsity: Any = None,
                  adapter: Any = None) -> None:
    """``pruner.targets`` (leaf names in the decoder blocks) and ``adapter.targets`` (module-name suffixes) each
    match at least one ``nn.Linear`` of the architecture; GPT-2's ``Conv1D`` projections match nothing."""
    layers = arch_layers(arch)
    if layers is None:
        return
    rules = []
    if pruner is not None and pruner.name != "none" and sparsity is not None and not sparsity.is_dense:
        rules.append(("pruner.targets", list(pruner.targets), set(pruner.targets) & set(layers.block_linears)))
    if adapter is not None and get_method(adapter.name).trains:
        rules.append(("adapter.targets", list(adapter.targets),
                      [n for n in layers.linears if matches(n, adapter.targets)]))
    kind = arch.get("model_type")
    for key, targets, found in rules:
        if found:
            continue
        if not layers.block_linears:
            raise UserError(f"model.path={path}: a {kind} model, whose decoder blocks have no nn.Linear layer "
                            f"({', '.join(layers.block_others) or 'no 2-D weight'}), so {key}={targets} matches "
                            "nothing",
                            "use a LLaMA-architecture model (LLaMA, Llama 2 and 3, Mistral, Qwen2, Gemma-2, SmolLM2: "
                            "q_proj ... down_proj as nn.Linear); GPT-2-style Conv1D models are not supported yet",
                            key=key)
        raise UserError(f"{key}={targets} matches no nn.Linear layer of the {kind} model at model.path={path}",
                        f"set {key} to names among {layers.block_linears}", key=key)
