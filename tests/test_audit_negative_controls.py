"""Negative controls of the sparsity audit: for every training adapter method and EVERY pruned matrix of a tiny
pruned model, one pruned position of the weight the layer applies is made non-zero the way a regression of that
method would do it, and ``audit()`` must fail naming that matrix. Before the merge (what the training callback
audits) and after it (what finalize audits); and on FSDP2-sharded tensors, in two gloo processes.

What each method's regression looks like:

- ``spp``: the frozen base weight moves (SPP only scales it, so a zero can only come back through it).
- ``sparse_lora``: the layer's mask admits a pruned position, so the delta ``s·(B A) ⊙ M`` lands there.
- ``masked_full``: the trained weight itself moves there (its gradient mask failed).
- ``lora`` (LoRA*): before the merge it is audited on its frozen base weight (which moves); after the merge the
  re-masking misses a pruned position, where the dense ``s·B A`` then stays.
- ``scale_lora`` (ScaleLoRA): the frozen base weight moves (``W ⊙ (B A)`` only scales it, as SPP).
- ``norms``: a linear weight moves (it was left trainable, or a merge touched it); only norm weights may.
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
import torch
from torch import nn

from spp.adapters import apply_adapter, get_method, make_config
from spp.adapters.registry import method_names
from spp.bitmask import pack_rows
from spp.models.tiny import tiny_llama
from spp.paths import REPO_ROOT
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model
from spp.training.callbacks.sparsity_audit import SparsityViolation, audit, original_name

Position = tuple[int, int]
CASES = {
    "spp": make_config("spp", r=4, dropout=0.0),
    "spp_no_residual": make_config("spp", r=4, dropout=0.0, residual=False, beta_init="ones"),
    "sparse_lora": make_config("sparse_lora", r=4, dropout=0.0),
    "losa": make_config("losa", r=4, dropout=0.0, block_errors=[1.0, 3.0]),  # ranks 2 and 6
    "masked_full": make_config("masked_full"),
    "lora": make_config("lora", r=4, dropout=0.0),
    "scale_lora": make_config("scale_lora", r=4),
    "norms": make_config("norms"),
}
FSDP_CASES = ("spp", "sparse_lora", "masked_full", "lora", "scale_lora")


@cache
def _pruned() -> tuple[nn.Module, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The tiny model pruned 2:4 by magnitude, its masks (True = kept) and its exact-zero pattern."""
    model = tiny_llama(seed=0)
    result = prune_model(model, None, PrunerConfig(name="magnitude"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                         device="cpu")
    return model, result.masks, result.zeros  # the zero pattern pruning records (masks and kept zeros)


def _layer(model: nn.Module, name: str) -> nn.Module:
    """The outermost module standing for the pruned linear ``name`` (an adapter wrapper, or the linear itself)."""
    return next(m for n, m in model.named_modules() if original_name(n) == name)


def _audited_weight(model: nn.Module, name: str) -> torch.Tensor:
    """The tensor whose pruned positions a regression would revive (see the module docstring)."""
    layer = _layer(model, name)
    if hasattr(layer, "base"):  # SPPLinear
        return layer.base.weight
    if hasattr(layer, "get_base_layer"):  # peft LoRA / SparsePEFT
        return layer.get_base_layer().weight
    return layer.weight  # masked full fine-tuning (and any merged model)


def _revive(case: str, model: nn.Module, name: str, pos: Position) -> Callable[[], None]:
    """Make pruned position ``pos`` of ``name``'s applied weight non-zero, as ``case`` would; returns the undo."""
    layer = _layer(model, name)
    with torch.no_grad():
        if case in ("sparse_lora", "losa"):  # SparsePEFT's layer (LoSA's too): a revived mask bit
            packed = layer.mask_packed.clone()
            mask = layer.mask
            mask[pos] = True
            layer.mask_packed = pack_rows(mask)
            return lambda: setattr(layer, "mask_packed", packed)
        weight = _audited_weight(model, name)
        weight[pos] = 0.5
    return lambda: weight.data.__setitem__(pos, 0.0)


def _train(model: nn.Module, steps: int = 2) -> None:
    """A few real AdamW steps on random tokens (masked full's gradient mask, adapters' own parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        ids = torch.randint(4, 260, (2, 16), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def _adapted(case: str, train: bool = True) -> nn.Module:
    pruned, masks, _ = _pruned()
    model, _ = apply_adapter(copy.deepcopy(pruned), CASES[case], masks)
    if train:
        _train(model)
    return model


def _pruned_position(mask: torch.Tensor, index: int, rows: range | None = None) -> Position:
    """A pruned position of ``mask``, spread over the matrix by ``index`` (within ``rows`` if given)."""
    pruned = (~mask).nonzero()
    if rows is not None:
        pruned = pruned[(pruned[:, 0] >= rows.start) & (pruned[:, 0] < rows.stop)]
    row, col = pruned[(index * 7919) % len(pruned)].tolist()
    return row, col


def _violation(name: str, when: str) -> str:
    return rf"^\[{when}\] {re.escape(name)}: 1 weight\(s\) pruned by the mask are non-zero"


def test_every_training_method_has_a_negative_control() -> None:
    trained = {n for n in method_names() if get_method(n).trains}
    assert {c.name for c in CASES.values()} == trained, "add the new method to CASES and to _revive"
    assert set(FSDP_CASES) <= set(CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_audit_names_every_matrix_with_a_revived_weight_before_the_merge(case: str) -> None:
    _, masks, zeros = _pruned()
    model = _adapted(case)
    assert audit(model, masks, zeros, when="trained")["layers"] == len(masks) == 14  # the positive control
    for index, (name, mask) in enumerate(masks.items()):
        undo = _revive(case, model, name, _pruned_position(mask, index))
        with pytest.raises(SparsityViolation, match=_violation(name, "trained")):
            audit(model, masks, zeros, when="trained")
        undo()
    assert audit(model, masks, zeros, when="trained")["layers"] == 14  # every undo restored the state


@pytest.mark.parametrize("case", list(CASES))
def test_audit_names_every_matrix_with_a_revived_weight_after_the_merge(case: str) -> None:
    _, masks, zeros = _pruned()
    method, cfg = get_method(CASES[case].name), CASES[case]
    trained = _adapted(case)
    merged, _ = method.merge(copy.deepcopy(trained), cfg, masks)
    report = audit(merged, masks, zeros, when="merged", kept_zeros_may_change=method.kept_zeros_may_change)
    assert report["layers"] == 14 and report["sparsity"] == 0.5  # the positive control
    if case == "norms":  # what trained is the norm weights; no linear weight moved
        before = dict(_pruned()[0].named_parameters())
        assert any(not torch.equal(p, before[n]) for n, p in merged.named_parameters() if n.endswith("norm.weight"))
        assert all(torch.equal(_audited_weight(merged, n), _audited_weight(_pruned()[0], n)) for n in masks)
    else:
        assert any(not torch.equal(_audited_weight(merged, n), _audited_weight(_pruned()[0], n)) for n in masks)
    for index, (name, mask) in enumerate(masks.items()):
        model, merge_masks = copy.deepcopy(trained), masks
        pos = _pruned_position(mask, index)
        if case == "lora":  # the re-masking misses one pruned position
            merge_masks = {**masks, name: mask.clone()}
            merge_masks[name][pos] = True
        else:
            _revive(case, model, name, pos)
        merged, _ = method.merge(model, cfg, merge_masks)
        with pytest.raises(SparsityViolation, match=_violation(name, "merged")):
            audit(merged, masks, zeros, when="merged", kept_zeros_may_change=method.kept_zeros_may_change)


def _kept_position(mask: torch.Tensor, index: int) -> Position:
    """A kept position of ``mask``, spread over the matrix by ``index``."""
    kept = mask.nonzero()
    row, col = kept[(index * 7919) % len(kept)].tolist()
    return row, col


def _round_to_zero(model: nn.Module, name: str, pos: Position) -> None:
    """Make the weight ``name``'s layer applies exactly 0.0 at kept position ``pos``, as float rounding of an update
    can: the audited weight is set to 0 there and, for the LoRA-type methods, the update's column is emptied (A's
    column ``pos[1]``) so that ``W + s·(B A)`` is 0 there too."""
    layer = _layer(model, name)
    with torch.no_grad():
        _audited_weight(model, name)[pos] = 0.0
        for a in getattr(layer, "lora_A", {}).values():
            a.weight[:, pos[1]] = 0.0


@pytest.mark.parametrize("case", list(CASES))
def test_a_kept_weight_rounded_to_zero_is_counted_not_raised(case: str) -> None:
    """A kept weight that became exactly 0.0 (SparsePEFT's grid point lr 3e-2 at Wanda 2:4 met one at its step-63
    checkpoint) means more zeros, none lost: the audit counts it before and after the merge and goes on; a revived
    pruned weight in the same model still stops it (the negative control)."""
    _, masks, zeros = _pruned()
    method, cfg = get_method(CASES[case].name), CASES[case]
    model = _adapted(case)
    before = audit(model, masks, zeros, when="trained")
    name = list(masks)[3]
    _round_to_zero(model, name, _kept_position(masks[name], 5))
    report = audit(model, masks, zeros, when="trained")
    assert (report["kept_weights_zeroed"], report["kept_zeros_filled"]) == (1, 0)
    assert report["zeros"] == before["zeros"] + 1 and report["kept_zeros_changed"] == 1
    merged, _ = method.merge(copy.deepcopy(model), cfg, masks)
    after = audit(merged, masks, zeros, when="merged", kept_zeros_may_change=method.kept_zeros_may_change)
    assert after["kept_weights_zeroed"] >= 1 and after["kept_zeros_filled"] == 0
    _revive(case, model, name, _pruned_position(masks[name], 3))
    with pytest.raises(SparsityViolation, match=_violation(name, "trained")):
        audit(model, masks, zeros, when="trained")


# ------------------------------------------------------------------------------------------ FSDP2 (2 processes)


def _fsdp_worker(out: Path) -> None:
    """One rank: shard each adapted model with FSDP2, then revive one pruned weight of every matrix in the shard of
    the rank owning that row (alternating ranks) and record what ``audit()`` says on this rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from spp.training.strategies import shard_model

    dist.init_process_group("gloo")
    rank, mesh = dist.get_rank(), init_device_mesh("cpu", (2,))
    _, masks, zeros = _pruned()
    results: dict[str, dict[str, str]] = {}
    for case in FSDP_CASES:
        model = _adapted(case, train=False)
        with torch.no_grad():  # stand-in for trained adapters: the same draw on both ranks
            gen = torch.Generator().manual_seed(1)
            for p in model.parameters():
                if p.requires_grad and case != "masked_full":
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1)
        shard_model(model, mesh, LlamaDecoderLayer)
        results[case] = {"clean": json.dumps(audit(model, masks, zeros, when="sharded"))}
        for index, (name, mask) in enumerate(masks.items()):
            weight = _audited_weight(model, name)
            half = mask.shape[0] // 2
            owner = index % 2
            row, col = _pruned_position(mask, index, range(owner * half, (owner + 1) * half))
            local = weight.to_local()
            with torch.no_grad():
                if rank == owner:
                    local[row - owner * half, col] = 0.5
            try:
                audit(model, masks, zeros, when="sharded")
                results[case][name] = "passed"
            except SparsityViolation as err:
                results[case][name] = str(err)
            with torch.no_grad():
                if rank == owner:
                    local[row - owner * half, col] = 0.0
        results[case]["sharded"] = type(_audited_weight(model, next(iter(masks)))).__name__
    out.joinpath(f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # 2 processes (25 s loaded); the same audit on whole tensors is tested above; CI runs it
def test_audit_names_every_revived_matrix_on_fsdp2_sharded_tensors(tmp_path: Path) -> None:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, __file__, str(tmp_path)], cwd=REPO_ROOT, env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    _, masks, _ = _pruned()
    for rank in range(2):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert set(results) == set(FSDP_CASES)
        for case, outcome in results.items():
            assert outcome.pop("sharded") == "DTensor", case  # the gathering path, not whole tensors
            assert json.loads(outcome.pop("clean"))["layers"] == 14
            assert set(outcome) == set(masks)
            for name, message in outcome.items():
                assert re.match(_violation(name, "sharded"), message), (rank, case, name, message)


if __name__ == "__main__":
    _fsdp_worker(Path(sys.argv[1]))
