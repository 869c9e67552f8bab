"""DeepSpeed ZeRO-3's parameter contract, emulated on CPU: every adapter method trains the same under it.

DeepSpeed does not run here (Lightning's DeepSpeed strategy needs CUDA), so :class:`Zero3Emulation` does to a model
what ZeRO-3 does to the parameters of the module it wraps (``deepspeed/runtime/zero/parameter_offload.py``):

- every parameter's ``data`` is replaced by an empty partition (its whole value is kept aside);
- a forward pre-hook on every module materialises that module's own parameters (``recurse=False``) plus those
  registered as external for it (``deepspeed.zero.register_external_parameter``); a forward hook releases them;
- backward likewise: an identity autograd function on the module's outputs gathers them again when the gradient
  reaches the module (DeepSpeed's ``PreBackwardFunctionForModule``), one on its positional inputs releases them
  once the gradient has left it (``PostBackwardFunctionModule``); what is still held when backward ends is released
  then (DeepSpeed's ``release_and_reset_all``). A parameter stays whole while any window that holds it is open.

So a parameter read outside its owner's (or its registered reader's) forward/backward is empty and the read fails.
Each training method, with its :meth:`~spp.adapters.base.AdapterMethod.external_parameters` registered, gives the
same loss and the same gradient for every trainable parameter as without the emulation (float64, tiny LLaMA pruned
2:4 by magnitude). Where DeepSpeed imports, the registration is the strategy's own: the real
``AdapterDeepSpeedStrategy.setup`` runs (Lightning's DeepSpeed setup, ``deepspeed.zero.register_external_parameter``)
with only ``deepspeed.initialize``'s partitioning played by the emulation, which reads what DeepSpeed recorded; so
removing the registration from the strategy fails SPP, SparsePEFT and ScaleLoRA here. Negative controls: those
methods without their external parameters fail (the emulation bites), and the sparsity audit, gathering through the
emulation, sees the right zeros and catches a revived weight. The finalize phase's export of a model held as
partitions (empty, 1-D) has the job's dtype in ``config.json`` and loads with ``AutoModelForCausalLM``.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from torch import nn
from train_helpers import tiny_job
from transformers import AutoModelForCausalLM

import spp.export.merged as merged
import spp.training.finalize as finalize
from spp.adapters import apply_adapter, get_method, make_config
from spp.adapters.base import AdapterMethod, ExternalParameters, count_parameters
from spp.adapters.registry import method_names
from spp.distributed import DistContext
from spp.export.manifest import ExportManifest
from spp.export.merged import ExportInputs
from spp.gathering import Gatherer, register_external_parameters
from spp.models.config import DTYPES
from spp.models.tiny import tiny_llama, tiny_tokenizer
from spp.pruning.config import PrunerConfig, SparsityConfig
from spp.pruning.engine import prune_model
from spp.training.callbacks.pruning import PrunedModel, PruningRecord
from spp.training.callbacks.sparsity_audit import SparsityViolation, audit, effective_weights, original_name
from spp.training.finalize import FinalizeResult
from spp.training.phases import FitResult, TrainingRecord
from spp.training.run import build_run
from spp.training.strategies import AdapterDeepSpeedStrategy, trained_weights_dtype

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="the strategy needs deepspeed importable (pip install -e '.[deepspeed]')")
CASES = {
    "spp_fused": make_config("spp", r=4, dropout=0.1, dtype="float64"),
    "spp_naive": make_config("spp", r=4, dropout=0.1, impl="naive", dtype="float64"),
    "spp_blocked_no_residual": make_config("spp", r=4, impl="blocked", residual=False, beta_init="ones",
                                             dtype="float64"),
    "sparse_lora": make_config("sparse_lora", r=4, dropout=0.1, dtype="float64"),
    "losa": make_config("losa", r=4, dropout=0.1, dtype="float64", block_errors=[1.0, 3.0]),  # ranks 2 and 6
    "lora": make_config("lora", r=4, dropout=0.1),
    "masked_full": make_config("masked_full"),
    "scale_lora": make_config("scale_lora", r=4, dtype="float64"),
    "norms": make_config("norms"),
}


class _Gate(torch.autograd.Function):
    """Identity in forward; runs ``action`` when the gradient passes (DeepSpeed's backward hook functions)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, action: Callable[[], None]) -> torch.Tensor:
        ctx.action = action
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.action()
        return grad, None


class Zero3Emulation(Gatherer):
    """ZeRO-3's contract on one process (see the module docstring); also a :class:`Gatherer` for the audit."""

    def __init__(self, model: nn.Module, backward_gathers: bool = True) -> None:
        self.model = model
        self.backward_gathers = backward_gathers  # False: a negative control of the emulation itself
        self.params = {id(p): p for p in model.parameters()}
        self.whole: dict[int, torch.Tensor] = {}
        self.holders: dict[int, set[Any]] = defaultdict(set)
        self.external: dict[int, list[nn.Parameter]] = defaultdict(list)
        self.handles: list[Any] = []
        self.pending: dict[int, int] = {}
        self.gathers = 0

    def register(self, reader: nn.Module, param: nn.Parameter) -> None:
        """``deepspeed.zero.register_external_parameter``, where DeepSpeed does not import."""
        self.external[id(reader)].append(param)

    # ------------------------------------------------------------------ windows
    def _window(self, module: nn.Module) -> list[nn.Parameter]:
        """The module's own parameters, those registered here, and those DeepSpeed's own
        ``register_external_parameter`` recorded on it (what its parameter coordinator reads)."""
        recorded = [p for _, p in module.ds_external_parameters()] if hasattr(module, "ds_external_parameters") else []
        return [*module.parameters(recurse=False), *self.external[id(module)], *recorded]

    def _open(self, key: Any, params: list[nn.Parameter]) -> None:
        for p in params:
            self.holders[id(p)].add(key)
            if p.data.numel() == 0 and self.whole[id(p)].numel():
                p.data = self.whole[id(p)]
                self.gathers += 1

    def _close(self, key: Any, params: list[nn.Parameter]) -> None:
        for p in params:
            self.holders[id(p)].discard(key)
            if not self.holders[id(p)]:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def _close_backward(self) -> None:
        """The end of backward: release what a module whose inputs needed no gradient still holds."""
        for pid, keys in self.holders.items():
            for key in [k for k in keys if k[0] == "backward"]:
                self._close(key, [self.params[pid]])

    # ------------------------------------------------------------------ hooks
    def _pre_forward(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if not self._window(module):
            return None
        self._open(("forward", id(module)), self._window(module))
        self.pending[id(module)] = 0

        def leave() -> None:  # the gradient has left the module through this input
            self.pending[id(module)] -= 1
            if self.pending[id(module)] == 0:
                self._close(("backward", id(module)), self._window(module))

        gated = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad and torch.is_grad_enabled():
                self.pending[id(module)] += 1
                a = _Gate.apply(a, leave)
            gated.append(a)
        return tuple(gated)

    def _post_forward(self, module: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
        if not self._window(module):
            return None
        self._close(("forward", id(module)), self._window(module))

        def enter() -> None:  # the gradient reaches the module
            self._open(("backward", id(module)), self._window(module))

        if isinstance(out, torch.Tensor) and out.requires_grad and self.backward_gathers:
            return _Gate.apply(out, enter)
        return out

    # ------------------------------------------------------------------ use
    def __enter__(self) -> Zero3Emulation:
        for pid, p in self.params.items():
            self.whole[pid] = p.data
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        for module in self.model.modules():  # every module, as DeepSpeed does: externals may come later
            self.handles += [module.register_forward_pre_hook(self._pre_forward),
                             module.register_forward_hook(self._post_forward)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()
        for pid, p in self.params.items():
            p.data = self.whole[pid]

    def backward(self, loss: torch.Tensor) -> None:
        """``engine.backward(loss)``: autograd, then what DeepSpeed releases at its end."""
        loss.backward()
        self._close_backward()

    @contextmanager
    def gathered(self, module: nn.Module) -> Iterator[None]:
        """``deepspeed.zero.GatheredParameters(module.parameters())`` (what the audit uses)."""
        key = ("gathered", object())
        params = list(module.parameters())
        self._open(key, params)
        try:
            yield
        finally:
            self._close(key, params)

    def empty(self) -> list[str]:
        """The parameters that are released (all of them, between steps)."""
        return [n for n, p in self.model.named_parameters() if p.data.numel() == 0]


# ------------------------------------------------------------------------------------------------ fixtures


@cache
def _pruned() -> tuple[nn.Module, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The tiny float64 model pruned 2:4 by magnitude, its masks (True = kept) and its exact-zero pattern."""
    model = tiny_llama(seed=0, dtype=torch.float64)
    masks = prune_model(model, None, PrunerConfig(name="magnitude"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                        device="cpu").masks
    return model, masks, {k: (w == 0).cpu() for k, w in effective_weights(model, set(masks))}


def _adapted(case: str) -> nn.Module:
    """The pruned model with ``case``'s adapter, its trainable tensors drawn away from their (often zero) init."""
    pruned, masks, _ = _pruned()
    model, _ = apply_adapter(copy.deepcopy(pruned), CASES[case], masks)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad and CASES[case].name != "masked_full":
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1)
    return model.train()


def _step(model: nn.Module, backward: Callable[[torch.Tensor], None]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward/backward on fixed tokens (dropout draws seeded): the loss and every trainable gradient."""
    ids = torch.randint(4, 260, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    backward(loss)
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _emulated_step(model: nn.Module, externals: ExternalParameters,
                   backward_gathers: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    with Zero3Emulation(model, backward_gathers) as emu:
        assert register_external_parameters(externals, register=emu.register) == len(externals)
        assert len(emu.empty()) == len(list(model.named_parameters()))  # every parameter is a partition
        result = _step(model, emu.backward)
        assert emu.empty() == [n for n, _ in model.named_parameters()]  # all released again after backward
        assert emu.gathers > 0
    return result


class _Holder(L.LightningModule):
    """What the strategy is given: a LightningModule holding the adapted model and its adapter method."""

    def __init__(self, model: nn.Module, method: AdapterMethod) -> None:
        super().__init__()
        self.model = model
        self.method = method


def _strategy_step(model: nn.Module, case: str, stage: int = 3) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One step of ``model`` under the real :class:`AdapterDeepSpeedStrategy`: Lightning's ``setup`` runs (the
    strategy registers the external parameters through ``deepspeed.zero.register_external_parameter``), except
    ``deepspeed.initialize``, whose partitioning the emulation plays (ZeRO-2 partitions no parameter)."""

    class EmulatedEngine(AdapterDeepSpeedStrategy):
        def init_deepspeed(self) -> None:
            self.emulation = Zero3Emulation(model) if self.zero_stage_3 else None

    strategy = EmulatedEngine(stage=stage, logging_batch_size_per_gpu=1)
    strategy.accelerator = CPUAccelerator()
    holder = _Holder(model, get_method(CASES[case].name))
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    holder.trainer = trainer
    strategy.connect(holder)
    strategy.setup(trainer)
    if strategy.emulation is None:
        return _step(model, lambda loss: loss.backward())
    with strategy.emulation as emu:
        assert len(emu.empty()) == len(list(model.named_parameters()))  # every parameter is a partition
        result = _step(model, emu.backward)
        assert emu.empty() == [n for n, _ in model.named_parameters()] and emu.gathers > 0
    return result


# ------------------------------------------------------------------------------------------------ tests


def test_every_training_method_is_emulated() -> None:
    assert {c.name for c in CASES.values()} == {n for n in method_names() if get_method(n).trains}
    assert all(get_method(n).zero3_refusal is None for n in method_names())  # every method trains under ZeRO-3


@pytest.mark.parametrize("case", list(CASES))
def test_zero3_emulation_gives_the_same_loss_and_gradients(case: str) -> None:
    method = get_method(CASES[case].name)
    reference, emulated = _adapted(case), _adapted(case)  # built twice: a deep copy loses masked_full's grad hook
    loss, grads = _step(reference, lambda loss: loss.backward())
    externals = method.external_parameters(emulated)
    emu_loss, emu_grads = _emulated_step(emulated, externals)
    torch.testing.assert_close(emu_loss, loss, rtol=1e-12, atol=0)
    assert grads.keys() == emu_grads.keys() and grads
    for name, grad in grads.items():
        assert grad.abs().sum() > 0, name  # every trainable tensor is exercised
        torch.testing.assert_close(emu_grads[name], grad, rtol=1e-12, atol=1e-15, msg=name)


@needs_deepspeed
@pytest.mark.parametrize("case", list(CASES))
def test_under_the_deepspeed_strategy_every_method_trains_as_without_zero3(case: str) -> None:
    """The strategy's own setup registers what each method reads outside its owner: without that registration
    (``AdapterDeepSpeedStrategy.setup``) SPP, SparsePEFT and ScaleLoRA read empty partitions and fail."""
    reference, emulated = _adapted(case), _adapted(case)
    loss, grads = _step(reference, lambda loss: loss.backward())
    emu_loss, emu_grads = _strategy_step(emulated, case)
    torch.testing.assert_close(emu_loss, loss, rtol=1e-12, atol=0)
    assert grads.keys() == emu_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(emu_grads[name], grad, rtol=1e-12, atol=1e-15, msg=name)
    pairs = get_method(CASES[case].name).external_parameters(emulated)
    assert all(any(q is p for _, q in reader.ds_external_parameters()) for reader, p in pairs)  # DeepSpeed's record


@needs_deepspeed
def test_under_zero2_the_strategy_registers_nothing() -> None:
    model = _adapted("spp_fused")
    _strategy_step(model, "spp_fused", stage=2)
    assert not any(hasattr(m, "ds_external_parameters") for m in model.modules())


def test_external_parameters_per_method() -> None:
    """SPP and ScaleLoRA: each layer's frozen base weight; SparsePEFT: each layer's LoRA factors; LoRA*, masked full
    and norms: none."""
    read = {}
    for case in ("spp_fused", "sparse_lora", "lora", "masked_full", "scale_lora", "norms"):
        model = _adapted(case)
        pairs = get_method(CASES[case].name).external_parameters(model)
        owners = {id(p): n for n, p in model.named_parameters()}
        readers = {id(m): n for n, m in model.named_modules()}
        for reader, param in pairs:
            assert not any(param is q for q in reader.parameters(recurse=False))  # truly another module's
            assert owners[id(param)].startswith(readers[id(reader)] + ".")  # ... one of the reader's children
        read[case] = (len(pairs), sorted({owners[id(p)][len(readers[id(r)]) + 1:] for r, p in pairs}))
    assert read == {"spp_fused": (14, ["base.weight"]),
                    "sparse_lora": (28, ["lora_A.default.weight", "lora_B.default.weight"]),
                    "lora": (0, []), "masked_full": (0, []), "scale_lora": (14, ["base.weight"]), "norms": (0, [])}


@pytest.mark.parametrize("case", ["spp_fused", "spp_naive", "sparse_lora", "scale_lora"])
def test_without_its_external_parameters_the_method_fails_under_the_emulation(case: str) -> None:
    model = _adapted(case)
    with pytest.raises((RuntimeError, ValueError, IndexError)):
        _emulated_step(model, [])


@pytest.mark.parametrize("case", ["spp_fused", "sparse_lora", "lora", "masked_full", "scale_lora", "norms"])
def test_the_emulation_bites_in_backward_too(case: str) -> None:
    """Without the backward re-gather, what a backward reads (SPP's and SparsePEFT's saved weights, the frozen
    weight behind LoRA's input gradient, masked full's own weight) is an empty partition: the backward fails."""
    model = _adapted(case)
    with pytest.raises(RuntimeError, match="size|shape|numel|dimension"):
        _emulated_step(model, get_method(CASES[case].name).external_parameters(model), backward_gathers=False)


@pytest.mark.parametrize("case", ["spp_fused", "sparse_lora", "lora", "masked_full", "scale_lora", "norms"])
def test_audit_through_the_emulation_sees_the_zeros_and_catches_a_revived_weight(case: str) -> None:
    _, masks, zeros = _pruned()
    model = _adapted(case)
    expected = audit(model, masks, zeros, when="plain")
    with Zero3Emulation(model) as emu:
        with pytest.raises((RuntimeError, ValueError, IndexError)):  # an audit that does not gather reads nothing
            audit(model, masks, zeros, when="ungathered", gatherer=Gatherer())
        assert audit(model, masks, zeros, when="zero3", gatherer=emu) == expected
        assert expected["layers"] == 14 and expected["sparsity"] == 0.5
        for name, mask in itertools.islice(masks.items(), 0, None, 5):
            layer = next(m for n, m in model.named_modules() if original_name(n) == name)
            weight = layer.base.weight if hasattr(layer, "base") else (
                layer.get_base_layer().weight if hasattr(layer, "get_base_layer") else layer.weight)
            row, col = (~mask).nonzero()[3].tolist()
            with emu.gathered(layer), torch.no_grad():
                weight[row, col] = 0.5  # written into the whole value, as a modifier rank would
            with pytest.raises(SparsityViolation, match=rf"\[zero3\] {name}: 1 weight\(s\) pruned"):
                audit(model, masks, zeros, when="zero3", gatherer=emu)
            with emu.gathered(layer), torch.no_grad():
                weight[row, col] = 0.0
        assert emu.empty() == [n for n, _ in model.named_parameters()]



# ------------------------------------------------------------------------------------------------ the export


def _export(job: Any, model: nn.Module, result: Any, emulate: bool, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``finalize.export`` of ``model`` (as it is, or held as ZeRO-3 partitions through the emulation)."""
    fitted = FitResult(model, {}, TrainingRecord(count_parameters(model)), deepspeed=emulate, sharded=emulate)
    pruned = PrunedModel(model, tiny_tokenizer(), result.masks, result.zeros, PruningRecord(result))
    outcome = FinalizeResult()
    run = build_run(job, Path(job.run_dir) / ("zero3" if emulate else "whole"))
    if not emulate:
        return finalize.export(run, pruned, fitted, DistContext(), outcome)
    with Zero3Emulation(model) as emu:
        monkeypatch.setattr(merged, "gatherer_for", lambda _model: emu)  # ZeroGatherer's part, played by the emulation
        assert all(p.data.dim() == 1 and p.data.numel() == 0 for p in model.parameters())  # as DeepSpeed leaves them
        return finalize.export(run, pruned, fitted, DistContext(), outcome)


@pytest.mark.parametrize(("torch_dtype", "precision", "expected"), [
    ("bfloat16", "32-true", torch.bfloat16),  # the weights as loaded
    ("float32", "bf16-mixed", torch.bfloat16),  # DeepSpeed's engine casts the module under bf16-mixed
    ("float32", "32-true", torch.float32),
])
def test_the_export_of_zero3_partitions_has_the_jobs_dtype_and_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     torch_dtype: str, precision: str,
                                                                     expected: torch.dtype) -> None:
    """The finalize phase's export of a model held as ZeRO-3 partitions (every parameter empty and 1-D outside a
    gather): ``config.json``'s dtype is the job's (``model.torch_dtype`` / ``trainer.precision``, resolved), and
    ``AutoModelForCausalLM`` loads it to the same weights and logits as the export of the same model held whole."""
    job = tiny_job(tmp_path, "strategy=deepspeed_stage3", "adapter=spp", f"model.torch_dtype={torch_dtype}",
                   f"trainer.precision={precision}", "export.merged=true")
    model = tiny_llama(seed=0, dtype=expected)  # what the strategy holds: the loaded weights, cast by DeepSpeed
    result = prune_model(model, None, PrunerConfig(name="magnitude"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4),
                         device="cpu")
    model, _ = apply_adapter(model, job.adapter, result.masks)
    with torch.no_grad():
        for p in (p for p in model.parameters() if p.requires_grad):
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype) * 0.05)
    whole, zero3 = _export(job, model, result, False, monkeypatch), _export(job, model, result, True, monkeypatch)
    for folder in (whole, zero3):
        assert json.loads((folder / "config.json").read_text())["dtype"] == str(expected).removeprefix("torch.")
        assert ExportManifest.read(folder).dtype == str(expected)
    loaded = {f: AutoModelForCausalLM.from_pretrained(f, dtype="auto") for f in (whole, zero3)}
    ids = torch.randint(4, 260, (2, 12), generator=torch.Generator().manual_seed(0))
    assert all(p.dtype == expected for p in loaded[zero3].parameters())
    theirs, ours = loaded[whole].state_dict(), loaded[zero3].state_dict()
    assert theirs.keys() == ours.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    torch.testing.assert_close(loaded[zero3](ids).logits, loaded[whole](ids).logits, rtol=0, atol=0)
    audit = ExportManifest.read(zero3).audit
    assert audit["layers"] == 14 and audit["sparsity"] == 0.5


@pytest.mark.parametrize("precision", ["32-true", "32", "bf16-mixed", "16-mixed", "bf16", "16", "bf16-true", "16-true",
                                       "64-true", "64"])
@pytest.mark.parametrize("load", ["float32", "bfloat16"])
def test_the_export_dtype_rule_is_what_lightnings_precision_plugins_do(precision: str, load: str) -> None:
    """Outside DeepSpeed the weights' dtype is what the Trainer's own precision plugin leaves a module in."""
    trainer = L.Trainer(accelerator="cpu", devices=1, precision=precision, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    converted = trainer.precision_plugin.convert_module(nn.Linear(2, 2).to(DTYPES[load]))
    assert trained_weights_dtype(load, precision, deepspeed=False) == converted.weight.dtype
    mixed = precision in ("bf16-mixed", "16-mixed", "bf16", "16")  # DeepSpeed's engine casts the module then
    expected = (torch.bfloat16 if "bf16" in precision else torch.float16) if mixed else converted.weight.dtype
    assert trained_weights_dtype(load, precision, deepspeed=True) == expected
    with pytest.raises(ValueError, match="trainer.precision='fp8' is not a Lightning precision"):
        trained_weights_dtype(load, "fp8", deepspeed=False)


def test_an_export_manifest_without_a_dtype_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    pruned, masks, _ = _pruned()
    manifest = ExportManifest(adapter={}, dtype="", pruning={})
    inputs = ExportInputs(get_method("none"), None, None, manifest)
    with pytest.raises(ValueError, match="dtype='' is not a floating-point torch dtype"):
        merged.export_streamed(pruned, inputs, tmp_path / "merged", DistContext())
    assert not list(tmp_path.iterdir())
