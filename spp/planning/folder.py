"""The evaluation placement of a saved model folder, computed as the run plan computes it."""

from __future__ import annotations

import json
from pathlib import Path

from spp.planning.hardware import Hardware
from spp.planning.placement import EvalPlacement, eval_placement
from spp.planning.run import eval_forward
from spp.planning.shapes import dtype_bytes, shape_from_arch
from spp.planning.spec import EvalSpec, RunSpec
from spp.projections import DEFAULT_TARGETS


def placement_of_folder(path: str | Path, seqlen: int, batch: int, lm_eval_batch: int, device_bytes: int | None,
                        devices_per_node: int, nodes: int) -> EvalPlacement:
    """:func:`eval_placement` of a saved model folder as the run plan computes it (``spp.planning.run.plan_run``):
    its weights' bytes, one decoder block (from its ``config.json`` on ``meta``) and, beside them, the larger of
    a perplexity and an lm-eval batch of ``seqlen`` tokens (logits, KV cache) and the CUDA context. What
    ``spp.eval.evaluate`` runs, so a run places its evaluation as its plan said."""
    folder = Path(path)
    arch = json.loads((folder / "config.json").read_text())
    nbytes = dtype_bytes(arch.get("dtype") or arch.get("torch_dtype"))
    shape = shape_from_arch(folder.name, arch, list(DEFAULT_TARGETS), nbytes)
    spec = RunSpec(shape=shape, act_bytes=nbytes, eval=EvalSpec(seqlen=seqlen, batch=batch,
                                                                       lm_eval_batch=lm_eval_batch))
    beside = sum(eval_forward(spec).values()) + Hardware().process_device_bytes
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return eval_placement(weights, device_bytes, devices_per_node, nodes, shape.block_bytes, beside)
