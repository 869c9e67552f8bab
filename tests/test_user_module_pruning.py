"""The pruning callback in a user's own LightningModule: the cache keyed on the weights the module holds, the
network found where the module keeps it, GPT-2's ``Conv1D`` projections pruned like ``nn.Linear``."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from spp.errors import UserError
from spp.models.config import ModelConfig
from spp.models.identity import weights_fingerprint
from spp.models.tiny import tiny_llama, tiny_model
from spp.paths import SAMPLE_DATA_DIR
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.training.callbacks.pruning import PruningCallback, PruningSettings

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Tune(L.LightningModule):
    """A user's module holding its network under ``attr`` (lr 0: the weights stay as pruned)."""

    def __init__(self, attr: str = "model", **networks: nn.Module) -> None:
        super().__init__()
        self.attr = attr
        for name, net in networks.items():
            setattr(self, name, net)

    def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
        return getattr(self, self.attr)(input_ids=batch, labels=batch).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.0)


def _fit(module: L.LightningModule, cache: Path) -> PruningCallback:
    settings = PruningSettings(ModelConfig(name="tiny", path="tiny"), PrunerConfig(name="wanda"),
                               SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                               CalibrationConfig(nsamples=4, seqlen=32), cache_dir=str(cache),
                               data_dir=str(SAMPLE_DATA_DIR))
    callback = PruningCallback(settings)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(torch.randint(4, 200, (4, 16)), batch_size=2))
    return callback


def _weights(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def test_built_weights_key_the_cache_not_the_config(tmp_path: Path) -> None:
    """A seed-1 module after a seed-0 one (same ``settings.model``, same cache) is pruned, not given seed 0's
    entry: its weights equal seed 1 pruned alone in an empty cache. The same weights again do hit."""
    first = _fit(Tune(model=tiny_llama(seed=0)), tmp_path / "cache")
    assert not first.pruned.record.result.cache_hit
    seed1 = Tune(model=tiny_llama(seed=1))
    second = _fit(seed1, tmp_path / "cache")
    assert not second.pruned.record.result.cache_hit
    alone = Tune(model=tiny_llama(seed=1))
    _fit(alone, tmp_path / "other-cache")
    got, want = _weights(seed1.model), _weights(alone.model)
    assert all(torch.equal(got[k], want[k]) for k in want)
    again = _fit(Tune(model=tiny_llama(seed=1)), tmp_path / "cache")  # negative control: the key is stable
    assert again.pruned.record.result.cache_hit


def test_fingerprint_sees_one_changed_weight() -> None:
    model = tiny_llama(seed=0)
    before = weights_fingerprint(model)
    assert weights_fingerprint(tiny_llama(seed=0)) == before
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3, 5] += 1e-3
    assert weights_fingerprint(model) != before


def test_network_kept_in_self_net_is_the_one_pruned(tmp_path: Path) -> None:
    """No ``self.model``: the callback prunes ``self.net`` (2 of every 4 weights zero in each projection) and adds
    no second model."""
    module = Tune(attr="net", net=tiny_llama(seed=0))
    _fit(module, tmp_path / "cache")
    assert not hasattr(module, "model")
    for name, layer in module.net.named_modules():
        if name.endswith(PROJ):
            groups = (layer.weight == 0).reshape(layer.weight.shape[0], -1, 4).sum(-1)
            assert torch.equal(groups, torch.full_like(groups, 2)), name


def test_two_networks_without_model_are_refused(tmp_path: Path) -> None:
    module = Tune(attr="net", net=tiny_llama(seed=0), other=tiny_llama(seed=1))
    with pytest.raises(UserError, match=r"net, other.*self\.model"):
        _fit(module, tmp_path / "cache")


def test_users_gpt2_module_is_pruned(tmp_path: Path) -> None:
    """GPT-2's ``Conv1D`` projections (``[in, out]``) are pruned 2:4 along their inputs, and the state dict keeps
    GPT-2's layout (a plain checkpoint)."""
    module = Tune(model=tiny_model(seed=0, model_type="gpt2"))
    _fit(module, tmp_path / "cache")
    state = module.model.state_dict()
    pruned = [k for k in state if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))]
    assert len(pruned) == 4 * module.model.config.n_layer
    for key in pruned:
        weight = state[key].t()  # Conv1D stores [in, out]: groups of 4 inputs are along its first axis
        groups = (weight == 0).reshape(weight.shape[0], -1, 4).sum(-1)
        assert torch.equal(groups, torch.full_like(groups, 2)), key
