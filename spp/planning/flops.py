"""FLOPs per token of training and evaluation, by part (the time estimate is FLOPs / stated throughput).

The model (``N`` = weights of the matrix products: every linear of the blocks plus the LM head; embedding
lookups cost nothing; ``s`` tokens of context):

* forward: ``2 N`` plus causal attention, ``2 s q`` per block (QKᵀ and AV, ``4 s q``, half of it masked; ``q``
  = heads x head dimension, ``h`` for LLaMA);
* backward of a **frozen** base: only the activation gradients, ``2 N`` plus twice the attention forward. The
  frozen weights get no weight gradient, so the ``6 N`` rule of full training does not hold;
* the adapter's own work per token, as its method states it (``AdapterMethod.train_flops``): SPP forms
  ``G = gᵀx`` for every adapted linear (``2 N_a``, ``N_a`` = adapted weights), and with dropout on it runs a
  second full-size product forward and backward (``+2 N_a`` each); masked full fine-tuning computes the weight
  gradients (``2 N_a``); LoRA, SparsePEFT and by default any method run their trainable tensors forward
  (``2 r (in + out)`` for a LoRA factor pair) and backward (twice that);
* activation checkpointing recomputes every block's forward once more;
* a dense teacher (``objective=distill``) runs one forward per token without gradients (``2 N`` plus attention).
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
