"""Bytes of the training and evaluation phases, by term, from the shapes.

Activations kept per token by a LLaMA block (what autograd saves in ``transformers``' ``LlamaDecoderLayer`` with
SDPA; ``a`` bytes per value, ``h`` hidden, ``q`` heads x head dim (4096 for Gemma-2-9B's ``h`` = 3584), ``i`` MLP):

* ``4h`` per RMSNorm (fp32 input; 2 per block, Gemma-2 4); ``a (2h + 5q)``: normed inputs of q/k/v and gate/up,
  SDPA's q, k, v (k, v repeated per head) and output, and ``o_proj``'s contiguous copy; ``4 a i`` for SwiGLU;
* eager attention (Gemma-2: SDPA has no softcapping): the ``heads x s`` scores (``ModelShape.score_bytes``);
* adapter dropout: each adapted linear's dropped-out input and mask (``(a + 1) x in``).

Checkpointing keeps only each block's input (``a h``). The loss adds ``(a + 12) x vocab`` per token (+``a x vocab``
with logit softcapping). A dense teacher (``objective=distill``) adds its weights (sharded under FSDP2) and, per
token, its logits, the KL's fp32 terms (``16 x vocab``) and with the feature term every block's output; its
forward runs without gradients first, so its intermediates are freed before the student's backward peak.
"""

from __future__ import annotations

from dataclasses import replace

from spp.planning.hardware import Hardware
from spp.planning.spec import RunSpec

TRAIN_HEAP_RETENTION = {True: 0.99, False: 0.17}
"""On a CPU run glibc keeps freed heap memory resident (its mmap threshold rises to the largest freed block, up to
32 MiB, so a step's many smaller tensors come from the heap and stay there), which RSS counts. Measured on one SPP
training step of SmolLM2-135M's shape (8 x 128 tokens, fp32): the peak RSS exceeded the live tensors
(the same step with ``MALLOC_MMAP_THRESHOLD_=131072``) by 0.99 x the step's activations, logits and transients
with activation checkpointing (+1706 vs +859 MiB) and 0.17 x without (+3420 vs +2911 MiB). Keyed by
checkpointing."""

DEEPSPEED_BUCKET = 200_000_000
"""Lightning's DeepSpeed ``reduce_bucket_size`` (elements)."""


def block_activation_bytes(spec: RunSpec) -> int:
    """Activation bytes one decoder block keeps for backward, per token (module docstring)."""
    shape, a = spec.shape, spec.act_bytes
    h, q, i = shape.hidden, shape.attention_width, shape.intermediate
    kept = 4 * shape.norms_per_block * h + a * (2 * h + 5 * q) + 4 * a * i + shape.score_bytes(spec.train.seqlen, a)
    if spec.adapter.trains and spec.adapter.dropout > 0:
        kept += sum(inp for _out, inp in spec.adapter.dims(spec.shape)) * (a + 1)
    return kept


def training_activations(spec: RunSpec) -> dict[str, int]:
    """Activations of one micro-batch (``micro_batch x seqlen`` tokens) at the peak of backward."""
    shape, a = spec.shape, spec.act_bytes
    tokens = spec.train.micro_batch * spec.train.seqlen
    block = block_activation_bytes(spec) * tokens
    kept = shape.blocks * tokens * shape.hidden * a + block if spec.train.checkpointing else shape.blocks * block
    logits = tokens * shape.vocab * (a + 12 + (a if shape.logit_softcap else 0))
    out = {"activations": kept, "logits": logits}
    if spec.adapter.keeps_weight:  # fused_cached: one merged weight per adapted linear, every block
        out["cached_weights"] = spec.adapter.adapted_weights(shape) * a
    return out


def activation_choices(spec: RunSpec) -> tuple[int, int]:
    """Activations and logits of one micro-batch ``(with, without)`` activation checkpointing."""
    return tuple(sum(training_activations(replace(spec, train=replace(spec.train, checkpointing=c))).values())
                 for c in (True, False))


def optimizer_terms(spec: RunSpec) -> dict[str, int]:
    """Adapter, gradients and AdamW state on one device.

    Lightning's precisions keep no master copy: AdamW's two moments are in each parameter's dtype (fp32 adapters
    by default; masked full in the weights' dtype). DDP adds its gradient buckets (a second copy of the
    gradients). FSDP2 shards all three over the ranks; the gradients of one block are whole while they are
    reduce-scattered. DeepSpeed (ZeRO-2 and 3) keeps an fp32 master copy and the two fp32 moments of its 1/N
    partition (12 bytes per parameter / N), fp32 gradient partitions and one reduce bucket.
    """
    n, nb = spec.adapter.trainable, spec.adapter.trainable_bytes
    world, shape = spec.world, spec.shape
    added = spec.adapter.added_bytes  # the method's own tensors (masked full, norms: the model's weights, counted)
    params = added // world if spec.sharded else added
    if spec.strategy == "deepspeed":
        bucket = min(n, DEEPSPEED_BUCKET) * nb // max(n, 1)
        return {"adapter": params, "gradients": 4 * n // world + bucket, "optimizer": 12 * n // world}
    if spec.strategy == "fsdp":
        return {"adapter": params, "gradients": nb // world + nb // shape.blocks, "optimizer": 2 * nb // world}
    buckets = 2 if spec.strategy == "ddp" else 1
    return {"adapter": params, "gradients": buckets * nb, "optimizer": 2 * nb}


def resident_weights(spec: RunSpec) -> dict[str, int]:
    """The frozen (pruned) weights on one device while training.

    Replicated under single-device, DDP and ZeRO-2; under FSDP2 each rank holds its 1/N shard plus, while it
    computes, the gathered current and next block (``reshard_after_forward`` prefetches one) and the root's
    unsharded embeddings, norm and LM head (FSDP2 does not reshard the root after forward). ZeRO-3 is counted the
    same way (its live-parameter limit, 1e9 values, is about one 70B block).
    """
    shape = spec.shape
    if not spec.sharded:
        weights = {"weights": shape.weight_bytes}
    else:
        gathered = 2 * shape.block_bytes + shape.outside_params * shape.bytes_per_param
        weights = {"weights": shape.weight_bytes // spec.world, "gathered": gathered}
    weights.update(spec.adapter.resident if spec.adapter.trains else {})  # the method's (packed masks), not sharded
    return weights


def teacher_terms(spec: RunSpec) -> tuple[dict[str, int], dict[str, int]]:
    """``(weights, step)``: the dense teacher on one device and what its outputs and the distillation loss hold
    at the peak of a step (module docstring); empty without a teacher."""
    if not spec.has_teacher:
        return {}, {}
    shape, a = spec.shape, spec.act_bytes
    tokens = spec.train.micro_batch * spec.train.seqlen
    # FSDP2 shards it like the student; every other strategy (ZeRO-3 too: it is not DeepSpeed's module) a replica
    weights = shape.weight_bytes // spec.world if spec.strategy == "fsdp" else shape.weight_bytes
    step = {"teacher_logits": tokens * shape.vocab * a, "distill_kl": tokens * shape.vocab * 16}
    if spec.teacher == "block_outputs":
        step["teacher_block_outputs"] = shape.blocks * tokens * shape.hidden * a
    return {"teacher_weights": weights}, step


def fit_device_bytes(spec: RunSpec, hw: Hardware) -> dict[str, int]:
    """Every term of one training device (GPU, or the CPU process under ``kind=cpu``), the dense teacher's too."""
    teacher, teacher_step = teacher_terms(spec)
    # what the adapter's forward and backward build for its largest linear, as its method says (SPP: the merged
    # weight and its backward's row chunks)
    transients = spec.adapter.forward_transient_values * spec.act_bytes + spec.adapter.backward_transient_bytes
    step = {**training_activations(spec), "adapter_transients": transients, **teacher_step}
    optimizer = optimizer_terms(spec)
    if spec.train.max_steps == 0 and spec.strategy != "deepspeed":
        # no step (a reconstruction-only run): the model is placed, AdamW's moments are made at the first step
        step, optimizer = {}, {"adapter": optimizer["adapter"]}
    terms = {**resident_weights(spec), **teacher, **optimizer, **step}
    if spec.kind == "gpu":
        terms["cuda_context"] = hw.process_device_bytes
    else:
        terms["heap_retention"] = int(TRAIN_HEAP_RETENTION[spec.train.checkpointing] * sum(step.values()))
    return {k: int(v) for k, v in terms.items() if v}


def forward_bytes(spec: RunSpec, batch: int, seqlen: int) -> dict[str, int]:
    """One no-grad forward of ``batch x seqlen`` tokens: the hidden state in and out of a block, one block's
    intermediates (eager attention's scores among them), the logits (with their fp32 copy and log-softmax) and the
    KV cache ``transformers`` returns by default (``use_cache``; every block's k and v)."""
    shape, a = spec.shape, spec.act_bytes
    tokens = batch * seqlen
    kv = shape.block_linears.get("self_attn.k_proj", (shape.hidden, shape.hidden))[0]
    block = (2 * shape.hidden + 2 * shape.attention_width + 3 * shape.intermediate) * a + shape.score_bytes(seqlen, a)
    logits = tokens * shape.vocab * (a + 8 + (a if shape.logit_softcap else 0))
    return {"hidden": 2 * tokens * shape.hidden * a, "block": tokens * block, "logits": logits,
            "kv_cache": 2 * shape.blocks * tokens * kv * a}
