"""Where the merged model is evaluated: replicas of ``k`` GPUs of one node, data-parallel across the replicas.

``k = 1`` when the weights fit one GPU within :data:`WEIGHT_SHARE` (80 %, leaving room for the CUDA context, a
batch's fp32 logits and lm-eval's KV cache), else lm-eval's ``parallelize=True``; a ``device_map`` split is uneven
by up to one block, so each GPU is charged ``weights / k`` plus one block (and ``activation_bytes`` when known).
"""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT_SHARE = 0.8
"""At most this share of a GPU's memory holds weights of the evaluated model."""


@dataclass(frozen=True)
class EvalPlacement:
    """How evaluation is placed: ``replicas`` copies of ``gpus_per_replica`` GPUs each (0: CPU), ``how`` being
    ``data_parallel``, ``parallelize`` or ``cpu`` (no GPU, or too big for a node), and the ``reason`` in one sentence.
    """

    replicas: int
    gpus_per_replica: int
    how: str
    reason: str


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def eval_placement(weight_bytes: int, device_bytes: int | None, devices_per_node: int, nodes: int,
                   block_bytes: int = 0, activation_bytes: int = 0) -> EvalPlacement:
    """The replicas that evaluate ``weight_bytes`` (``device_bytes`` ``None``: no GPU). ``k`` is the fewest GPUs whose
    share fits (module docstring); the node holds ``devices_per_node // k`` replicas, each spread over
    ``devices_per_node // replicas`` GPUs (more headroom, same speed: a replica computes on one GPU at a time).
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
