"""FLOPs per token of training and evaluation, by part (the time estimate is FLOPs / stated throughput).

``N`` = matrix weights (blocks' linears and the LM head), ``s`` tokens of context, ``q`` = heads x head dim:

* forward ``2 N`` plus causal attention ``2 s q`` per block (QKᵀ and AV, half masked);
* backward of a **frozen** base: activation gradients only, ``2 N`` plus twice the attention (not the ``6 N`` rule);
* the adapter's own work, as its method states it (``AdapterMethod.train_flops``);
* activation checkpointing recomputes each block's forward; a distill teacher adds one forward without gradients.
"""

from __future__ import annotations

from spp.planning.shapes import ModelShape
from spp.planning.spec import RunSpec


def matmul_params(shape: ModelShape) -> int:
    """``N``: weights that take part in matrix products per token (block linears and the LM head)."""
    return shape.blocks * sum(o * i for o, i in shape.block_linears.values()) + shape.vocab * shape.hidden


def forward_flops(shape: ModelShape, context: int) -> int:
    """FLOPs of one token's forward with ``context`` tokens before it (module docstring)."""
    return 2 * matmul_params(shape) + 2 * context * shape.attention_width * shape.blocks


def train_flops(spec: RunSpec) -> dict[str, int]:
    """FLOPs per training token, by part (module docstring)."""
    shape, adapter = spec.shape, spec.adapter
    s = spec.train.tokens_per_example
    attention = 2 * s * shape.attention_width * shape.blocks
    n = matmul_params(shape)
    parts = {"forward": 2 * n + attention, "backward": 2 * n + 2 * attention}
    if adapter.trains:
        parts["adapter"] = adapter.flops  # the method's own (AdapterMethod.train_flops)
    if spec.train.checkpointing:
        parts["recompute"] = 2 * (n - shape.vocab * shape.hidden) + attention
    if spec.has_teacher:
        parts["teacher_forward"] = 2 * n + attention
    return parts


def train_tokens(spec: RunSpec) -> int:
    """Tokens the training runs through: the examples of every epoch (or ``max_steps x global_batch`` when that is
    fewer) times the tokens per example."""
    train = spec.train
    examples = train.examples * train.epochs
    if train.max_steps >= 0:  # 0: no step
        examples = min(examples, train.max_steps * train.global_batch)
    return examples * train.tokens_per_example
