"""Unit checks of the training pieces: optimiser/schedule, adapter-only checkpoints, audit, loggers, sizes."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import compose_train

from spp.adapters import apply_adapter, make_config
from spp.loggers import build_loggers, run_tags
from spp.models import tiny_llama
from spp.pruning import current_masks
from spp.training.callbacks.sparsity_audit import SparsityViolation, audit, effective_weights
from spp.training.config import Scheduler, TrainerConfig, load_job
from spp.training.module import SPPModule
from spp.training.trainer import accumulation, resolve_precision

ADAPTER = {"name": "spp", "r": 4, "scale": 2.0, "dropout": 0.0, "alpha_init": "kaiming", "beta_init": "zeros",
           "use_beta": True, "impl": "fused", "residual": True,
           "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


class _FakeTrainer:
    estimated_stepping_batches = 100


def _module(lr: float = 4e-3, weight_decay: float = 0.001, warmup_ratio: float = 0.03, scheduler: str = "linear",
            gradient_checkpointing: bool = False, compile_model: bool = False) -> SPPModule:
    model = tiny_llama(seed=0)
    with torch.no_grad():  # 2:4-style zeros: drop every other input column of each target
        for name, mod in model.named_modules():
            if name.endswith(tuple(ADAPTER["targets"])):
                mod.weight[:, ::2] = 0
    model, _ = apply_adapter(model, make_config(**ADAPTER), {})
    trainer = TrainerConfig(lr=lr, weight_decay=weight_decay, warmup_ratio=warmup_ratio, scheduler=Scheduler(scheduler),
                            gradient_checkpointing=gradient_checkpointing, compile=compile_model)
    module = SPPModule(model, trainer)
    module.configure_model()
    return module


def test_only_adapter_parameters_are_trained_with_adamw_and_paper_schedule():
    module = _module(lr=1e-2, weight_decay=0.001, warmup_ratio=0.03, scheduler="linear")
    module._trainer = _FakeTrainer()
    opt_cfg = module.configure_optimizers()
    opt, sched = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["weight_decay"] == 0.001
    params = {id(p) for g in opt.param_groups for p in g["params"]}
    named = dict(module.model.named_parameters())
    trained = {n for n, p in named.items() if id(p) in params}
    assert trained == set(module.trainable_names)
    assert all(n.endswith(("spp_alpha", "spp_beta")) for n in trained) and len(trained) == 2 * 7 * 2
    warmup = math.ceil(0.03 * 100)  # 3 steps
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[warmup] == pytest.approx(1e-2)
    assert lrs[1] == pytest.approx(1e-2 / warmup)
    assert lrs[50] == pytest.approx(1e-2 * (100 - 50) / (100 - warmup))


def test_cosine_schedule_follows_half_cosine():
    module = _module(lr=1.0, warmup_ratio=0.0, scheduler="cosine")
    module._trainer = _FakeTrainer()
    cfg = module.configure_optimizers()
    opt, sched = cfg["optimizer"], cfg["lr_scheduler"]["scheduler"]
    for _ in range(25):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * (1 + math.cos(math.pi * 25 / 100)))


def test_fit_start_switches_the_eval_mode_model_to_train_mode():
    module = _module()
    assert not module.model.training  # load_model returns eval-mode models
    module.on_fit_start()
    assert all(m.training for m in module.model.modules())


def test_checkpoint_keeps_only_adapter_tensors_and_rejects_foreign_ones():
    module = _module()
    ckpt = {"state_dict": {f"model.{n}": p for n, p in module.model.named_parameters()}}
    module.on_save_checkpoint(ckpt)
    assert set(ckpt["state_dict"]) == {f"model.{n}" for n in module.trainable_names}
    ckpt["state_dict"].pop(next(iter(ckpt["state_dict"])))
    with pytest.raises(ValueError, match="adapter tensor"):
        module.on_load_checkpoint(ckpt)


def test_audit_accepts_trained_spp_and_names_a_revived_weight():
    module = _module()
    model = module.model
    masks = current_masks(model, ADAPTER["targets"])
    reference = {k: (w == 0).cpu() for k, w in effective_weights(model, set(masks))}
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.normal_()
    report = audit(model, masks, reference, when="trained")
    assert report["sparsity"] == pytest.approx(0.5) and report["layers"] == 14
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.base.weight[3, 0] = 1.0
    with pytest.raises(SparsityViolation, match=r"model\.layers\.1\.mlp\.up_proj.*non-zero"):
        audit(model, masks, reference, when="checkpoint")


def test_audit_counts_filled_kept_zeros_only_when_allowed():
    module = _module()
    model = module.model
    masks = current_masks(model, ADAPTER["targets"])
    name = "model.layers.0.self_attn.q_proj"
    weight = model.model.layers[0].self_attn.q_proj.base.weight
    row, col = (masks[name]).nonzero()[0].tolist()
    with torch.no_grad():
        weight[row, col] = 0.0  # a kept weight that is exactly zero (as in quantized checkpoints)
    reference = {k: (w == 0).cpu() for k, w in effective_weights(model, set(masks))}
    with torch.no_grad():
        weight[row, col] = 0.5  # LoRA* fills it; pruned positions stay zero
    with pytest.raises(SparsityViolation, match="differs from the pruning-time pattern at 1 position"):
        audit(model, masks, reference, when="merged")
    report = audit(model, masks, reference, when="merged", kept_zeros_may_change=True)
    assert report["kept_zeros_changed"] == 1


def test_gradient_accumulation_and_precision_resolution():
    cfg = load_job(compose_train(["model=tiny", "trainer.global_batch_size=32", "data.train_batch_size=4"]))
    assert accumulation(cfg) == 8
    bad = compose_train(["model=tiny", "trainer.global_batch_size=30", "data.train_batch_size=4"])
    with pytest.raises(ValueError, match="trainer.global_batch_size"):
        accumulation(load_job(bad))
    assert resolve_precision("auto", "cpu") == "32-true"
    assert resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"


def test_wandb_offline_without_key_under_run_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    cfg = load_job(compose_train(["model=tiny", "pruner=sparsegpt", "sparsity=unstructured50", "adapter.r=8",
                                  "logger=[csv,wandb,tensorboard]"]))
    ids = run_tags(cfg.model.name, cfg.pruner.name, cfg.sparsity.name, cfg.adapter.name, cfg.adapter.r,
                   cfg.logger.wandb)
    loggers = build_loggers(cfg.logger, tmp_path / "run", ids)
    kinds = [type(lg).__name__ for lg in loggers]
    assert kinds == ["CSVLogger", "TensorBoardLogger", "WandbLogger"]
    wandb_logger = loggers[-1]
    assert wandb_logger._wandb_init["mode"] == "offline"
    assert wandb_logger._wandb_init["dir"] == str(tmp_path / "run")
    tags = ids
    assert tags["group"] == "tiny-sparsegpt-unstructured50" and "r8" in tags["tags"]
    assert set(tags["tags"]) <= set(wandb_logger._wandb_init["tags"])


def test_gradient_checkpointing_switch_gives_the_same_gradients():
    ids = torch.randint(4, 200, (2, 24))
    grads = []
    for ckpt in (False, True):
        module = _module(gradient_checkpointing=ckpt)
        module.model.train()
        assert module.model.is_gradient_checkpointing is ckpt
        with torch.no_grad():
            for p in module.parameters():
                if p.requires_grad:
                    p.fill_(0.01)
        module(input_ids=ids, labels=ids).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in module.parameters() if p.requires_grad]))
    torch.testing.assert_close(grads[0], grads[1])


def test_fsdp_is_fsdp2_and_builds_on_cpu_processes():
    from spp.training.strategies import AdapterFSDPStrategy, build_strategy

    job = load_job(compose_train(["model=tiny", "strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2"]))
    strategy = build_strategy(job.strategy, "cpu", world_size=2)
    assert isinstance(strategy, AdapterFSDPStrategy)
    assert strategy._process_group_backend == "gloo" and strategy._data_parallel_size == 2


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_compiled_training_forward_matches_eager_and_keeps_state_dict_keys():
    torch.manual_seed(0)
    eager = _module()
    torch.manual_seed(0)  # the same kaiming alpha in both
    compiled = _module(compile_model=True)
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    assert not any("_orig_mod" in k for k in compiled.state_dict())
    ids = torch.randint(4, 200, (2, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    for m in (eager, compiled):
        m.model.train()
        m.log = lambda *a, **k: None
    losses = [m.training_step(batch, 0) for m in (eager, compiled)]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for loss in losses:
        loss.backward()
    grads = [dict((n, p.grad) for n, p in m.model.named_parameters() if p.requires_grad) for m in (eager, compiled)]
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 28
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
