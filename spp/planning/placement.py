"""Where the merged model is evaluated: replicas of ``k`` GPUs each, data-parallel across the replicas.

A replica is a group of ``k`` GPUs of one node holding one full copy of the merged model: ``k = 1`` when the
weights fit one GPU with headroom, else lm-eval's ``parallelize=True`` (accelerate's ``device_map`` over ``k``
GPUs). Perplexity windows and lm-eval requests are split over the replicas. The headroom rule
(:data:`WEIGHT_SHARE`): a GPU holds at most 80 % of its memory in weights, which leaves the rest for the CUDA
context, the logits of a batch (``batch x seqlen x vocab`` in fp32: 1 GiB for 8 x 1024 x 32000) and the KV cache
of lm-eval's requests. A ``device_map`` split is uneven by up to one decoder block, so each of the ``k`` GPUs is
charged ``weights / k`` plus one block (the caller passes the block's bytes; 0 when unknown). A caller that knows
the evaluation batch passes its bytes too (``activation_bytes``: logits, KV cache, CUDA context): the share and
those bytes must then fit the whole GPU as well.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

WEIGHT_SHARE = 0.8
"""At most this share of a GPU's memory holds weights of the evaluated model."""


@dataclass(frozen=True)
class EvalPlacement:
    """How evaluation is placed.

    Attributes:
        replicas: Full copies of the merged model evaluating in parallel (data-parallel over them).
        gpus_per_replica: GPUs holding one copy (0 = on the CPU).
        how: ``data_parallel`` (one GPU per copy), ``parallelize`` (a copy split over ``gpus_per_replica`` GPUs of
            one node) or ``cpu`` (no GPU, or the model does not fit a node's GPUs).
        reason: One sentence: the sizes and the rule that decided.
    """

    replicas: int
    gpus_per_replica: int
    how: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def eval_placement(weight_bytes: int, device_bytes: int | None, devices_per_node: int, nodes: int,
                   block_bytes: int = 0, activation_bytes: int = 0) -> EvalPlacement:
    """The replicas that evaluate a model of ``weight_bytes`` on ``nodes`` nodes of ``devices_per_node`` GPUs of
    ``device_bytes`` each (``None``: no GPU).

    ``k`` is the fewest GPUs whose share (``weight_bytes / k + block_bytes`` when ``k > 1``) is at most
    :data:`WEIGHT_SHARE` of one GPU, and at most the GPU's memory with ``activation_bytes`` added; the node then
    holds ``devices_per_node // k`` replicas, and each replica
    spreads over ``devices_per_node // replicas`` GPUs (the same number of replicas with more headroom: a
    ``parallelize`` replica computes on one GPU at a time, so its speed does not depend on ``k``).
    """
    if device_bytes is None or devices_per_node < 1:
        return EvalPlacement(1, 0, "cpu", f"no GPU: the {_gib(weight_bytes)} merged model is evaluated on the CPU "
                                          "of global rank 0")
    budget = WEIGHT_SHARE * device_bytes

    def fits(share: float) -> bool:
        return share <= budget and share + activation_bytes <= device_bytes

    if fits(weight_bytes):
        replicas = devices_per_node * nodes
        return EvalPlacement(replicas, 1, "data_parallel", f"the {_gib(weight_bytes)} merged model fits one GPU "
                             f"(<= {WEIGHT_SHARE:.0%} of {_gib(device_bytes)}, {_gib(activation_bytes)} of batch and "
                             f"context beside it): {replicas} replica(s) of 1 GPU")
    k = next((k for k in range(2, devices_per_node + 1) if fits(weight_bytes / k + block_bytes)), None)
    if k is None:
        return EvalPlacement(1, 0, "cpu", f"the {_gib(weight_bytes)} merged model does not fit the "
                             f"{devices_per_node} GPU(s) of a node at {WEIGHT_SHARE:.0%} of {_gib(device_bytes)} "
                             f"each (with {_gib(activation_bytes)} of batch and context): evaluated on the CPU of "
                             "global rank 0")
    per_node = devices_per_node // k
    k = devices_per_node // per_node
    return EvalPlacement(per_node * nodes, k, "parallelize", f"the {_gib(weight_bytes)} merged model needs "
                         f"{_gib(weight_bytes / k + block_bytes)} per GPU split over {k} GPUs (<= {WEIGHT_SHARE:.0%} "
                         f"of {_gib(device_bytes)}): {per_node * nodes} replica(s) of {k} GPUs")
