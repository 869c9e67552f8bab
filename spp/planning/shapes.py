"""A model's sizes from its config alone: the skeleton is built on the ``meta`` device, no weight is read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from spp.models.config import DTYPES
from spp.models.conv1d import linearize_conv1d
from spp.projections import block_linears, block_projections, decoder_layers, resolve_targets


@dataclass
class ModelShape:
    """Parameter counts of a decoder-only causal LM, per part.

    Attributes:
        outside_params: Parameters outside the blocks (embeddings, final norm, LM head; a tied head once).
        linears: ``(out_features, in_features)`` of each prunable linear of one block, by name inside it
            (``self_attn.q_proj``; GPT-2's attention and MLP each have a ``c_proj``).
        block_linears: The same for every ``nn.Linear`` of one block.
        attn_width: Heads x head dimension; 0 means ``hidden`` (Gemma-2-9B: 16 x 256 = 4096 against 3584).
        norms_per_block: Normalisation layers in one block (LLaMA 2; Gemma-2 4: pre- and post-norms).
        eager_attention: ``transformers`` materialises the ``heads x s x s`` scores (Gemma-2: SDPA has no softcap).
        attn_softcap, logit_softcap: Scores / logits pass through ``tanh`` softcapping (Gemma-2).
    """

    name: str
    blocks: int
    block_params: int
    outside_params: int
    embedding_params: int
    linears: dict[str, tuple[int, int]] = field(default_factory=dict)
    hidden: int = 0
    intermediate: int = 0
    vocab: int = 0
    bytes_per_param: int = 2
    block_linears: dict[str, tuple[int, int]] = field(default_factory=dict)
    heads: int = 0
    attn_width: int = 0
    norms_per_block: int = 2
    eager_attention: bool = False
    attn_softcap: bool = False
    logit_softcap: bool = False

    @property
    def attention_width(self) -> int:
        """Width of q, of the attention output and of k/v once repeated to every head (``attn_width`` or
        ``hidden``)."""
        return self.attn_width or self.hidden

    def score_bytes(self, seqlen: int, act_bytes: int) -> int:
        """Bytes per token of the attention scores an eager implementation keeps (0 under SDPA): ``heads x
        seqlen`` scores as the fp32 softmax output and its cast to the activation dtype, plus the ``tanh``
        output under attention softcapping (what autograd saves in ``eager_attention_forward``)."""
        if not self.eager_attention:
            return 0
        return self.heads * seqlen * (4 + act_bytes * (2 if self.attn_softcap else 1))

    @property
    def params(self) -> int:
        """All parameters (tied ones once)."""
        return self.blocks * self.block_params + self.outside_params

    @property
    def pruned_params(self) -> int:
        """Weights of the prunable linears over every block."""
        return self.blocks * sum(o * i for o, i in self.linears.values())

    @property
    def weight_bytes(self) -> int:
        """The whole model in its dtype."""
        return self.params * self.bytes_per_param

    @property
    def block_bytes(self) -> int:
        """One decoder block in the model's dtype."""
        return self.block_params * self.bytes_per_param


def attention_fields(config: Any, block: nn.Module) -> dict[str, Any]:
    """The :class:`ModelShape` fields that differ between LLaMA-style architectures, from the config and one
    block: heads, heads x head dimension (``head_dim`` when the config states it), normalisation layers per block,
    eager attention and softcapping."""
    hidden = int(config.hidden_size)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    head_dim = int(getattr(config, "head_dim", 0) or (hidden // heads if heads else 0))
    return {"heads": heads, "attn_width": heads * head_dim if heads * head_dim != hidden else 0,
            "norms_per_block": sum(1 for m in block.modules() if "norm" in type(m).__name__.lower()),
            "eager_attention": getattr(config, "_attn_implementation", None) == "eager",
            "attn_softcap": bool(getattr(config, "attn_logit_softcapping", None)),
            "logit_softcap": bool(getattr(config, "final_logit_softcapping", None))}


BUILT_BLOCKS = 2
"""Decoder blocks :func:`shape_from_arch` builds on ``meta`` (two, to check that blocks are alike; the counts are
scaled to ``num_hidden_layers``): a 70B skeleton of 80 blocks takes seconds to build, two take milliseconds."""


def per_layer_fields(fields: dict[str, Any], blocks: int) -> dict[str, Any]:
    """``fields`` with ``num_hidden_layers=blocks`` and every per-layer list (one entry per decoder block, such as
    Qwen2's and Gemma2's ``layer_types``) cut to its first ``blocks`` entries, so the config stays consistent."""
    layers = fields.get("num_hidden_layers")
    out = {k: (list(v)[:blocks] if isinstance(v, (list, tuple)) and layers is not None and len(v) == int(layers)
               and not k.endswith(("token_id", "token_ids")) else v) for k, v in fields.items()}
    return {**out, "num_hidden_layers": blocks}


def arch_config(arch: dict[str, Any], blocks: int | None = None) -> Any:
    """The ``transformers`` config of ``arch`` (``model_type`` defaults to ``llama``), cut to ``blocks`` decoder
    blocks when given (:func:`per_layer_fields`)."""
    from transformers import AutoConfig

    fields = {k: v for k, v in arch.items() if k not in ("model_type", "architectures", "transformers_version")}
    return AutoConfig.for_model(str(arch.get("model_type") or "llama"),
                                **(fields if blocks is None else per_layer_fields(fields, blocks)))


def skeleton_from_arch(arch: dict[str, Any], blocks: int) -> nn.Module:
    """The causal LM described by ``arch`` (a model group's ``arch`` block, ``config.json``'s fields or a GGUF
    header's; ``model_type`` defaults to ``llama``) with ``blocks`` decoder blocks, its parameters on ``meta``
    (buffers real), a tied LM head tied as loading ties it, GPT-2's ``Conv1D`` held as ``nn.Linear``."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(arch_config(arch, blocks))
    model.tie_weights()  # as loading does: a tied LM head is the embedding, counted once
    linearize_conv1d(model)
    return model


def dtype_bytes(name: Any) -> int:
    """Bytes per weight of a dtype name of :data:`~spp.models.config.DTYPES` (2 for another name, e.g. ``auto``)."""
    return DTYPES.get(str(name), torch.bfloat16).itemsize


def shape_from_arch(name: str, arch: dict[str, Any], targets: list[str], bytes_per_param: int = 2) -> ModelShape:
    """The :class:`ModelShape` of the causal LM described by ``arch``, built on ``meta`` with :data:`BUILT_BLOCKS`
    blocks (:func:`skeleton_from_arch`): every block of a LLaMA-style stack has the same parameters, so one built
    block stands for all ``num_hidden_layers`` of them."""
    blocks = int(arch_config(arch).num_hidden_layers)  # GPT-2's config names it n_layer
    model = skeleton_from_arch(arch, min(blocks, BUILT_BLOCKS))
    _prefix, layers = decoder_layers(model)
    sizes = {sum(p.numel() for p in block.parameters()) for block in layers}
    if len(sizes) != 1:
        raise ValueError(f"{name}: decoder blocks of different sizes {sorted(sizes)}; the plan assumes alike blocks")
    block, block_params = layers[0], sizes.pop()
    total = sum(p.numel() for p in model.parameters())  # ``parameters()`` counts a tied head once
    config = model.config
    chosen = block_linears(block, resolve_targets(block, targets, "pruner.targets"))
    every = {n: (m.out_features, m.in_features) for n, m in block_projections(block).items()}
    return ModelShape(
        name=name, blocks=blocks, block_params=block_params,
        outside_params=total - len(layers) * block_params,
        embedding_params=sum(p.numel() for p in model.get_input_embeddings().parameters()),
        linears={n: (m.out_features, m.in_features) for n, m in chosen.items()},
        hidden=int(config.hidden_size), intermediate=max(i for _o, i in every.values()),  # the MLP's down projection
        # reads the widest input (GPT-2's n_inner, OPT's ffn_dim: the family's name of intermediate_size)
        vocab=int(config.vocab_size), bytes_per_param=bytes_per_param,
        block_linears=every,
        **attention_fields(config, block))
