"""One rank of a multi-process reconstruction (started by ``tests/test_reconstruction_distributed.py`` through
``python -m torch.distributed.run``, gloo): prune the tiny model and reconstruct it with each form as the jobs do
(rank 0 holds the weights, the other ranks a ``meta`` skeleton), and save what this rank saw.

Usage: ``reconstruction_rank_script.py OUT_PREFIX CASES_JSON`` (``{case: ReconstructConfig fields}``); rank ``r``'s
global seed is set to ``r`` just before each reconstruction (rank 0's as in :func:`reference`, the others
apart). Writes ``OUT_PREFIX.rank<r>.pt`` holding,
per case, rank 0's reconstructed weights (``<case>/weight/<name>``), every block's parameters as this rank last ran
it (``<case>/block<i>/<name>``: after the merge and the broadcast), the form's tensors as block ``i``'s first
optimiser step found them (``<case>/init<i>/<j>``) and the per-block losses (``<case>/losses``).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import spp.pruning.reconstruction.train_block as train_block
from spp.distributed import DistContext
from spp.models.config import ModelConfig
from spp.models.loading import load_skeleton
from spp.models.offload import OffloadedModel
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.paths import SAMPLE_DATA_DIR
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_offloaded
from spp.pruning.reconstruction.config import ReconstructConfig
from spp.pruning.reconstruction.engine import reconstruct_offloaded
from spp.pruning.reconstruction.phase import frozen_copy

PRUNER = PrunerConfig(name="wanda")
NM24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
CAL = CalibrationConfig(nsamples=4, seqlen=64, batch_size=2)


def model_on(ctx: DistContext, last: dict[str, torch.Tensor], case: str) -> torch.nn.Module:
    """The tiny model on rank 0, its skeleton elsewhere; each block's parameters are recorded at every forward (the
    last record of a block is its final state on this rank)."""
    model = tiny_llama(seed=0) if ctx.is_main else load_skeleton(ModelConfig(name="tiny", path="tiny"))
    for i, block in enumerate(model.model.layers):
        def record(module: torch.nn.Module, _args: object, i: int = i) -> None:
            for key in [k for k in last if k.startswith(f"{case}/block{i}/")]:
                del last[key]  # a forward with the form attached names other tensors
            for name, p in module.named_parameters():
                last[f"{case}/block{i}/{name}"] = p.detach().clone()
        block.register_forward_pre_hook(record)
    return model


def spy_on_first_step(inits: list[list[torch.Tensor]]) -> None:
    """Record the form's trainable tensors as each block's first optimiser step finds them (every rank sums the
    gradients before each step: the first sum of a new parameter list is a new block's start)."""
    real = train_block._sum_gradients
    seen: list[list[torch.nn.Parameter]] = []  # the lists: an id() is reused once a list is freed

    def sum_gradients(params: list[torch.nn.Parameter], ctx: DistContext) -> None:
        if not any(params is known for known in seen):
            seen.append(params)
            inits.append([p.detach().clone() for p in params])
        real(params, ctx)

    train_block._sum_gradients = sum_gradients


def reference(case: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Prune and reconstruct the tiny model in this process (world 1); returns its weights and per-block record."""
    model = tiny_llama(seed=0)
    dense = frozen_copy(model)
    ctx = DistContext()
    off = OffloadedModel(model, ctx)
    masks = prune_offloaded(off, tiny_tokenizer(), PRUNER, NM24, CAL, SAMPLE_DATA_DIR).masks
    dense_off = OffloadedModel(dense, ctx)
    torch.manual_seed(0)
    result = reconstruct_offloaded(off, dense_off, tiny_tokenizer(), masks, PRUNER.targets,
                                   ReconstructConfig(name="blockwise", **case), SAMPLE_DATA_DIR)
    dense_off.restore()
    off.restore()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, result.blocks


def main(prefix: str, cases: dict[str, dict]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    ctx = DistContext.current("cpu")
    out: dict[str, torch.Tensor] = {}
    inits: list[list[torch.Tensor]] = []
    spy_on_first_step(inits)
    for name, case in cases.items():
        last: dict[str, torch.Tensor] = {}
        inits.clear()
        model = model_on(ctx, last, name)
        dense = frozen_copy(model)  # before pruning, as the phase takes it (a skeleton off rank 0)
        off = OffloadedModel(model, ctx)
        masks = prune_offloaded(off, tiny_tokenizer(), PRUNER, NM24, CAL, SAMPLE_DATA_DIR).masks
        dense_off = OffloadedModel(dense, ctx)
        cfg = ReconstructConfig(name="blockwise", **case)
        torch.manual_seed(ctx.rank)  # the ranks' RNGs apart; rank 0's as the reference's
        result = reconstruct_offloaded(off, dense_off, tiny_tokenizer(), masks, PRUNER.targets, cfg, SAMPLE_DATA_DIR)
        dense_off.restore()
        restored = off.restore()
        out.update(last)
        out.update({f"{name}/init{i}/{j}": t for i, block in enumerate(inits) for j, t in enumerate(block)})
        out[f"{name}/losses"] = torch.tensor([[b["loss_start"], b["loss_end"], b["steps"]] for b in result.blocks],
                                             dtype=torch.float64)
        if ctx.is_main:
            out.update({f"{name}/weight/{n}": p.detach().clone() for n, p in restored.named_parameters()})
    torch.save(out, f"{prefix}.rank{ctx.rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
