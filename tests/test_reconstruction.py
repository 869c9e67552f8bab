"""Block-wise reconstruction (``reconstruct=blockwise``) on the tiny random LLaMA, in one process.

The block loss against float64 loops written from its definition; a block that is not pruned reconstructs to
itself (loss 0 before and after, every weight bit-identical) while a pruned block's loss falls; every pruned weight
stays exactly zero for every trainable form, and the engine stops when a merge fills one; the cache (through
``spp.pruning.reconstruction.phase``, as ``prune.py`` uses it) hits with bit-identical weights and no dense copy, and
its key follows the reconstruction's fields, not the end-to-end stage's.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

import spp.pruning.reconstruction.one_block as one_block_module
import spp.pruning.reconstruction.phase as phase_module
from spp.distributed import DistContext
from spp.models.offload import OffloadedModel
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.paths import SAMPLE_DATA_DIR
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_offloaded
from spp.pruning.masks import MaskSet
from spp.pruning.reconstruction.config import (
    ReconstructConfig,
    ReconstructInputs,
    ReconstructLoss,
    ReconstructTargets,
)
from spp.pruning.reconstruction.engine import ReconstructResult, reconstruct_offloaded
from spp.pruning.reconstruction.loss import window_losses
from spp.pruning.reconstruction.phase import frozen_copy, get_or_reconstruct
from spp.pruning.reconstruction.train_block import mean_loss

FORMS = ["spp", "masked_full", "norms", "scale_lora", "sparse_lora"]
PRUNER = PrunerConfig(name="wanda")
NM24 = SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
CAL = CalibrationConfig(nsamples=4, seqlen=64, batch_size=2)
LR = {"masked_full": 1e-3}  # the weights themselves train: a smaller step than the adapters' 1e-2


def recon_cfg(form: str = "spp", **over: object) -> ReconstructConfig:
    """A seconds-long reconstruction of the tiny model: 4 windows of 64 tokens, 2 epochs of 2 steps."""
    base = {"name": "blockwise", "form": form, "nsamples": 4, "seqlen": 64, "epochs": 2, "batch_size": 2,
            "lr": LR.get(form, 1e-2)}
    return ReconstructConfig(**{**base, **over})


def pruned_tiny(seed: int = 0) -> tuple[nn.Module, nn.Module, MaskSet]:
    """The tiny model pruned by Wanda 2:4 (in place), its dense copy (taken before pruning) and the masks."""
    model = tiny_llama(seed=seed)
    dense = frozen_copy(model)
    off = OffloadedModel(model, DistContext())
    masks = prune_offloaded(off, tiny_tokenizer(), PRUNER, NM24, CAL, SAMPLE_DATA_DIR).masks
    off.restore()
    return model, dense, masks


def reconstruct(model: nn.Module, dense: nn.Module, masks: MaskSet, cfg: ReconstructConfig) -> ReconstructResult:
    """Run the engine on ``model`` (in place) against ``dense`` in this process."""
    ctx = DistContext()
    off, dense_off = OffloadedModel(model, ctx), OffloadedModel(dense, ctx)
    try:
        return reconstruct_offloaded(off, dense_off, tiny_tokenizer(), masks, PRUNER.targets, cfg, SAMPLE_DATA_DIR)
    finally:
        dense_off.restore()
        off.restore()


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit pattern (``-0.0`` differs from ``0.0``)."""
    return t.contiguous().view(torch.int32)


# -- 1. the loss against its definition -------------------------------------------------------------------------------

def reference_losses(out: torch.Tensor, target: torch.Tensor, loss: str) -> list[float]:
    """Per window, from the definitions, in float64 loops: ``mse`` the mean of (h − h_dense)² over tokens and
    features; ``nmse`` per token ‖h − h_dense‖² / ‖h_dense‖², averaged over tokens."""
    values = []
    for b in range(out.shape[0]):
        per_token = []
        for t in range(out.shape[1]):
            diff = sum((float(out[b, t, k]) - float(target[b, t, k])) ** 2 for k in range(out.shape[2]))
            norm = sum(float(target[b, t, k]) ** 2 for k in range(out.shape[2]))
            per_token.append(diff / out.shape[2] if loss == "mse" else diff / norm)
        values.append(sum(per_token) / len(per_token))
    return values


@pytest.mark.parametrize("loss", ["mse", "nmse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_window_losses_match_the_definition(loss, dtype):
    gen = torch.Generator().manual_seed(3)
    target = (torch.randn(3, 5, 7, generator=gen) * torch.tensor([0.1, 1.0, 10.0]).view(3, 1, 1)).to(dtype)
    out = (target.float() * (1 + 0.3 * torch.randn(3, 5, 7, generator=gen))).to(dtype)  # errors scale with h
    got = window_losses(out, target, loss)
    assert got.shape == (3,) and got.dtype in (torch.float32, torch.float64)
    want = torch.tensor(reference_losses(out.double(), target.double(), loss), dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=0)
    if loss == "nmse":  # scale-free: the windows' targets span 100x, their normalised errors do not
        assert float(want.max() / want.min()) < 1e4 and float(got[2] / got[0]) < 1e3
    else:  # the plain error grows with the window's scale (the negative control of the normalisation)
        assert float(got[2]) > 10 * float(got[0])


@pytest.mark.parametrize("loss", ["mse", "nmse"])
def test_mean_loss_averages_every_window(loss):
    gen = torch.Generator().manual_seed(4)
    targets = [torch.randn(1, 6, 8, generator=gen) * s for s in (0.5, 1.0, 4.0)]
    outs = [t + torch.randn(t.shape, generator=gen) for t in targets]
    kept: list[torch.Tensor] = []
    got = mean_loss(lambda j: outs[j], targets, recon_cfg(loss=ReconstructLoss(loss)), DistContext(), keep=kept)
    per_window = [reference_losses(o.double(), t.double(), loss)[0] for o, t in zip(outs, targets, strict=True)]
    assert math.isclose(got, sum(per_window) / 3, rel_tol=1e-6)
    assert all(k is o for k, o in zip(kept, outs, strict=True))


# -- 2. controls: an unpruned block reconstructs to itself, a pruned block's loss falls ------------------------------

def all_kept(model: nn.Module) -> MaskSet:
    """All-True masks for every decoder linear (nothing pruned)."""
    return MaskSet({n: torch.ones_like(m.weight, dtype=torch.bool) for n, m in model.named_modules()
                    if isinstance(m, nn.Linear) and n.startswith("model.layers.")})


EXACT_START = {"scale_lora": {"r": 4}}
"""Forms whose initial tensors merge to the identity only with some options: ScaleLoRA's ``B A`` starts at
``r · (1/√r)²``, exactly 1 in float32 for r = 1, 4, 16 but ``1 − 2⁻²⁴`` for the default r = 8
(:func:`test_scale_lora_default_rank_starts_one_ulp_off`). SPP (β = 0), sparse LoRA (B = 0), masked full (the
weights) and norms (the norm weights) start exactly at the pruned block."""


@pytest.mark.parametrize("form", FORMS)
def test_unpruned_block_reconstructs_to_itself(form):
    model = tiny_llama(seed=0)
    dense = frozen_copy(model)
    before = weights(model)
    result = reconstruct(model, dense, all_kept(model), recon_cfg(form, form_options=EXACT_START.get(form, {})))
    assert [b["block"] for b in result.blocks] == [0, 1] and all(b["steps"] == 4 for b in result.blocks)
    for b in result.blocks:  # outputs equal the targets: zero gradients, so AdamW moves nothing
        assert b["loss_start"] == 0.0 and b["loss_end"] == 0.0, (form, b)
    for name, p in model.named_parameters():
        assert torch.equal(bits(p.detach()), bits(before[name])), f"{form}: {name} changed"


def test_scale_lora_default_rank_starts_one_ulp_off():
    """Why ScaleLoRA's control needs r = 4: at r = 8 the start is not the pruned block, the loss during training is
    not 0, and AdamW (which normalises the gradient) moves the weights; the block ends ~1e-12 off."""
    model = tiny_llama(seed=0)
    before = weights(model)
    result = reconstruct(model, frozen_copy(model), all_kept(model), recon_cfg("scale_lora"))
    assert result.blocks[0]["loss_start"] == 0.0 and 0 < result.blocks[0]["loss_end"] < 1e-9
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    init = torch.tensor(1 / math.sqrt(8), dtype=torch.float32)
    assert float(torch.full((1, 8), init) @ torch.full((8, 1), init)) == 1 - 2 ** -24


@pytest.mark.parametrize("form", ["spp", "masked_full"])
def test_pruned_block_loss_falls(form):
    model, dense, masks = pruned_tiny()
    result = reconstruct(model, dense, masks, recon_cfg(form))
    for b in result.blocks:
        assert 0 < b["loss_end"] < b["loss_start"], (form, b)


def test_same_inputs_targets_are_the_dense_block_on_the_reconstructed_prefix():
    """``targets=same_inputs`` (EBFT's): block 0's inputs are the dense ones either way, so its losses equal the
    default's; from block 1 on the target is the dense block on the reconstructed prefix, which is closer to what
    the pruned block can produce than the dense trajectory: a lower starting loss (negative control: block 0)."""
    model, dense, masks = pruned_tiny()
    default = reconstruct(model, dense, masks, recon_cfg("spp"))
    model, dense, masks = pruned_tiny()
    same = reconstruct(model, dense, masks, recon_cfg("spp", targets="same_inputs"))
    assert same.blocks[0]["loss_start"] == default.blocks[0]["loss_start"]
    assert same.blocks[0]["loss_end"] == default.blocks[0]["loss_end"]
    assert same.blocks[1]["loss_start"] < default.blocks[1]["loss_start"]


# -- 3. zeros stay zero ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", FORMS)
def test_pruned_weights_stay_exactly_zero(form):
    model, dense, masks = pruned_tiny()
    pruned = weights(model)
    reconstruct(model, dense, masks, recon_cfg(form))
    moved = 0
    for name in masks:
        w, mask = model.get_submodule(name).weight.detach(), masks[name]
        assert mask.float().mean() == 0.5 and torch.equal(mask, pruned[f"{name}.weight"] != 0), name
        assert torch.equal(bits(w[~mask]), torch.zeros_like(bits(w[~mask]))), f"{form}: {name} pruned weight != +0.0"
        assert torch.equal(w != 0, mask), f"{form}: {name}'s zero pattern is not the pruning's"
        moved += int((w != pruned[f"{name}.weight"]).sum())
    norms = [n for n in pruned if "norm" in n]
    moved_norms = sum(int((model.get_parameter(n) != pruned[n]).sum()) for n in norms)
    if form == "norms":  # it trains the norms alone: the linears' kept weights are untouched
        assert moved == 0 and moved_norms > 0
    else:  # a negative control of the zero check: the kept weights did train
        assert moved > 0


def test_a_merge_that_fills_a_pruned_weight_stops_the_engine(monkeypatch):
    real = one_block_module.merge_adapter

    def filling_merge(*args, **kwargs):
        merged, stats = real(*args, **kwargs)
        with torch.no_grad():
            merged.get_submodule("layers.0.mlp.down_proj").weight.add_(1.0)  # every entry, the pruned ones too
        return merged, stats

    monkeypatch.setattr(one_block_module, "merge_adapter", filling_merge)
    model, dense, masks = pruned_tiny()
    with pytest.raises(RuntimeError, match=r"filled pruned weights of model\.layers\.0\.mlp\.down_proj"):
        reconstruct(model, dense, masks, recon_cfg("spp"))


# -- 5. the cache ------------------------------------------------------------------------------------------------------

def cached_run(cache_dir, cfg: ReconstructConfig, spy: dict[str, int]) -> tuple[ReconstructResult, dict]:
    """Prune and reconstruct a fresh tiny model through both caches (``phase.get_or_reconstruct``: the probe, the
    dense copy when needed, the pruning cache, ``reconstruct_phase``)."""
    model = tiny_llama(seed=0)
    _, result = get_or_reconstruct(model, tiny_tokenizer(), _model_cfg(), PRUNER, NM24, CAL, cfg, str(cache_dir),
                                   str(SAMPLE_DATA_DIR))
    return result, weights(model)


def _model_cfg():
    from spp.models.config import ModelConfig
    return ModelConfig(name="tiny", path="tiny")


def entries(cache_dir) -> list[str]:
    return sorted(p.name for p in cache_dir.glob("pruning/*/*-blockwise-*") if p.is_dir())


@pytest.fixture()
def spy(monkeypatch) -> dict[str, int]:
    """Counts the dense copies and the engine's passes the phase makes."""
    counts = {"dense_copies": 0, "reconstructions": 0}
    real_copy, real_run = phase_module.frozen_copy, phase_module.reconstruct_offloaded

    def copy(model):
        counts["dense_copies"] += 1
        return real_copy(model)

    def run(*args, **kwargs):
        counts["reconstructions"] += 1
        return real_run(*args, **kwargs)

    monkeypatch.setattr(phase_module, "frozen_copy", copy)
    monkeypatch.setattr(phase_module, "reconstruct_offloaded", run)
    return counts


def test_cache_hit_is_bit_identical_without_a_dense_copy(tmp_path, spy):
    cfg = recon_cfg("spp")
    first, w1 = cached_run(tmp_path, cfg, spy)
    assert not first.cache_hit and spy == {"dense_copies": 1, "reconstructions": 1}
    assert len(entries(tmp_path)) == 1 and first.cache_path.endswith(entries(tmp_path)[0])
    second, w2 = cached_run(tmp_path, cfg, spy)
    assert second.cache_hit and spy == {"dense_copies": 1, "reconstructions": 1}  # no copy, no pass
    assert second.blocks == first.blocks and second.cache_path == first.cache_path
    assert w1.keys() == w2.keys() and all(torch.equal(bits(w1[n]), bits(w2[n])) for n in w1)
    pruned_only = tiny_llama(seed=0)
    off = OffloadedModel(pruned_only, DistContext())
    prune_offloaded(off, tiny_tokenizer(), PRUNER, NM24, CAL, SAMPLE_DATA_DIR)
    off.restore()
    assert any(not torch.equal(w2[n], p) for n, p in pruned_only.named_parameters())  # the hit is not the pruning's


def test_a_full_disk_while_writing_the_entry_is_one_line_and_leaves_no_entry(tmp_path, spy, monkeypatch):
    """The reconstruction cache on a full disk ends the job as the pruning cache does: one ``UserError`` line, the
    unfinished entry removed (not a bare ``RuntimeError``)."""
    import errno

    import spp.pruning.cache.store as store
    from spp.errors import UserError
    write = store._atomic_write_bytes

    def full(path, data):
        if "blockwise" in path.parent.name and path.name.startswith("weights-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(path, data)

    monkeypatch.setattr(store, "_atomic_write_bytes", full)
    with pytest.raises(UserError) as caught:
        cached_run(tmp_path, recon_cfg("spp"), spy)
    line = str(caught.value)
    assert "disk filled up while writing the reconstruction cache entry" in line and "\n" not in line
    assert spy["reconstructions"] == 1 and entries(tmp_path) == []


def test_a_corrupt_weights_file_in_a_finished_entry_is_one_line_and_the_rerun_reconstructs(tmp_path, spy):
    """A finished entry whose weights file fails its checksum when a hit reads it ends the job in the phase's one
    ``UserError`` line (not a bare ``CorruptEntryError``), and the entry goes, so running again reconstructs as the
    line says; the control: the first run wrote an entry and the rerun writes a good one again."""
    from spp.errors import UserError

    cfg = recon_cfg("spp")
    first, w1 = cached_run(tmp_path, cfg, spy)
    (entry,) = [p for p in tmp_path.glob("pruning/*/*-blockwise-*") if p.is_dir()]
    weights_file = sorted(entry.glob("weights-*.safetensors"))[-1]
    data = bytearray(weights_file.read_bytes())
    data[-8:] = bytes(8 - b % 2 for b in data[-8:])  # the tail (a weight's bytes) changed: the sha256 fails
    weights_file.write_bytes(bytes(data))
    with pytest.raises(UserError) as caught:
        cached_run(tmp_path, cfg, spy)
    line = str(caught.value)
    assert "failed its checks while it was read" in line and "\n" not in line
    assert entries(tmp_path) == [] and spy["reconstructions"] == 1
    again, w3 = cached_run(tmp_path, cfg, spy)
    assert not again.cache_hit and spy["reconstructions"] == 2 and len(entries(tmp_path)) == 1
    assert all(torch.equal(bits(w1[n]), bits(w3[n])) for n in w1)


CHANGES = {"lr": 3e-2, "epochs": 1, "form": "norms", "form_options": {"r": 4}, "nsamples": 3,
           "loss": ReconstructLoss.nmse, "inputs": ReconstructInputs.dense, "targets": ReconstructTargets.same_inputs}


def test_each_reconstruction_field_is_its_own_entry(tmp_path, spy):
    cfg = recon_cfg("spp")
    cached_run(tmp_path, cfg, spy)
    seen = entries(tmp_path)
    for n, (field, value) in enumerate(CHANGES.items(), start=2):
        changed = dataclasses.replace(cfg, **{field: value})
        result, _ = cached_run(tmp_path, changed, spy)
        now = entries(tmp_path)
        assert not result.cache_hit and len(now) == n, f"reconstruct.{field} did not change the key"
        assert spy["reconstructions"] == n
        seen = now
    assert len(set(seen)) == len(CHANGES) + 1


def test_the_end_to_end_stage_does_not_change_the_key(tmp_path):
    from train_helpers import tiny_job

    from spp.training.phases import pruning_callback_settings
    from spp.training.run import build_run

    def digest(*extra: str) -> str:
        settings = pruning_callback_settings(build_run(tiny_job(tmp_path, "reconstruct=blockwise", *extra), tmp_path))
        found = phase_module.probe(settings.reconstruct, settings.model, settings.pruner, settings.sparsity,
                                   settings.calibration, settings.cache_dir, settings.data_dir, DistContext())
        assert found.digest is not None and not found.hit
        return found.digest

    base = digest()
    assert digest("trainer.lr=0.5") == base
    assert digest("adapter=masked_full") == base
    assert digest("adapter=sparse_lora", "trainer.lr=1e-5") == base
    assert digest("reconstruct.lr=0.5") != base  # the negative control: a reconstruction field does
    assert digest("reconstruct.form=norms") != base


def test_a_null_lr_is_the_forms_own_rate(tmp_path):
    """``reconstruct.lr`` null (the default) trains at the form's ``reconstruct_lr`` and keys as that rate written
    out (one cache entry for both); another form's null is another rate; the run's record says the rate used."""
    from train_helpers import tiny_job

    from spp.adapters.registry import get_method
    from spp.pruning.reconstruction.engine import learning_rate
    from spp.training.phases import pruning_callback_settings
    from spp.training.run import build_run

    def settings(*extra: str):
        return pruning_callback_settings(build_run(tiny_job(tmp_path, "reconstruct=blockwise", *extra), tmp_path))

    def digest(*extra: str) -> str:
        s = settings(*extra)
        return phase_module.probe(s.reconstruct, s.model, s.pruner, s.sparsity, s.calibration, s.cache_dir,
                                  s.data_dir, DistContext()).digest

    assert settings().reconstruct.lr is None
    assert learning_rate(settings().reconstruct) == get_method("spp").reconstruct_lr == 0.1
    assert learning_rate(settings("reconstruct.form=masked_full").reconstruct) == 3e-3
    assert digest() == digest("reconstruct.lr=0.1")
    assert digest("reconstruct.form=masked_full") == digest("reconstruct.form=masked_full", "reconstruct.lr=0.003")
    assert digest() != digest("reconstruct.lr=0.05")  # the negative control: another rate is another entry
    cfg = dataclasses.replace(recon_cfg("norms"), lr=None)
    result, _ = cached_run(tmp_path, cfg, {"dense_copies": 0, "reconstructions": 0})
    assert result.summary()["lr"] == get_method("norms").reconstruct_lr
    hit, _ = cached_run(tmp_path, cfg, {"dense_copies": 0, "reconstructions": 0})
    assert hit.cache_hit and hit.summary()["lr"] == result.summary()["lr"]
