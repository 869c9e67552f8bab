"""Lightning's DDP / FSDP2 / DeepSpeed strategies from the ``strategy`` group, FSDP2 sharding, state gathering."""

from __future__ import annotations

import importlib
from collections.abc import Generator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ModelParallelStrategy, Strategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from transformers import PreTrainedModel

from spp.deepspeed_support import check_deepspeed
from spp.distributed import DistContext
from spp.errors import UserError
from spp.gathering import register_external_parameters
from spp.models.config import DTYPES
from spp.models.conv1d import native_layout
from spp.models.offload import params_to_meta
from spp.projections import block_class
from spp.training.config import StrategyConfig, StrategyName

AUTO = "auto"
"""``model.decoder_layer_cls=auto``: the class of the loaded model's decoder blocks (:func:`block_class`)."""


def decoder_layer_class(name: str | None) -> type[nn.Module] | None:
    """Resolve a decoder-layer class name (``model.decoder_layer_cls``: a ``transformers`` class name or a dotted
    path); ``auto`` (or None) gives None: the class is then taken from the loaded model (:func:`block_class`).

    Raises:
        ValueError: the class cannot be found (names the config key).
    """
    import transformers

    if name is None or name == AUTO:
        return None
    module_name, _, cls_name = name.rpartition(".")
    if not module_name:
        family = name.split("DecoderLayer")[0].split("Block")[0].lower()
        module_name = f"transformers.models.{family}.modeling_{family}"
    cls = getattr(transformers, name, None) if cls_name == name else None
    if cls is None:
        try:
            cls = getattr(importlib.import_module(module_name), cls_name, None)
        except ImportError:
            cls = None
    if cls is None:
        raise ValueError(
            f"model.decoder_layer_cls={name!r} is not a class in transformers; give auto (the loaded model's), "
            "e.g. LlamaDecoderLayer, or a dotted path (transformers.models.llama.modeling_llama.LlamaDecoderLayer)"
        )
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"model.decoder_layer_cls={name!r} is not an nn.Module class")
    return cls


class AdapterFSDPStrategy(ModelParallelStrategy):
    """Lightning's FSDP2 strategy, checkpointing only the trainable tensors (``ignore_frozen_params``): the stock
    one gathers the frozen pruned weights on every checkpoint."""

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The trainable tensors, gathered on rank 0 (a collective: every rank calls it)."""
        return full_trainable_state(self.model)


class AdapterDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's DeepSpeed strategy (ZeRO-2 / ZeRO-3) for an adapter on a pruned model.

    Checkpoints exclude frozen weights; ``configure_model`` runs without ``deepspeed.zero.Init`` (the model exists
    already); under ZeRO-3 each adapter layer's ``external_parameters`` are registered in ``setup``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exclude_frozen_parameters", True)
        super().__init__(*args, **kwargs)

    @contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        """No ``zero.Init`` around ``configure_model`` (see the class docstring)."""
        self._init_config_if_needed()
        yield

    def setup(self, trainer: Any) -> None:
        """Register the adapter's external parameters (ZeRO-3), then Lightning's setup (``deepspeed.initialize``)."""
        self._init_config_if_needed()
        if self.zero_stage_3:
            module = self.lightning_module
            register_external_parameters(module.method.external_parameters(module))
        super().setup(trainer)


def build_strategy(cfg: StrategyConfig, accelerator: str = "auto", world_size: int = 1) -> Strategy | str:
    """Instantiate the Lightning strategy named by ``cfg.name`` (``fsdp``: FSDP2 over one data-parallel mesh).

    Raises:
        UserError: DeepSpeed requested but not installed, or without CUDA (the preflight checks first).
    """
    timeout = timedelta(seconds=cfg.timeout_s)
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    backend = cfg.process_group_backend or ("gloo" if on_cpu else None)
    if cfg.name is StrategyName.auto:
        return "auto"
    if cfg.name is StrategyName.ddp:
        return DDPStrategy(process_group_backend=backend, find_unused_parameters=cfg.find_unused_parameters,
                           timeout=timeout)
    if cfg.name is StrategyName.fsdp:
        return AdapterFSDPStrategy(data_parallel_size=world_size, tensor_parallel_size=1,
                                   save_distributed_checkpoint=False, process_group_backend=backend, timeout=timeout)
    check_deepspeed(cfg, accelerator)
    return AdapterDeepSpeedStrategy(stage=cfg.stage, offload_optimizer=cfg.offload_optimizer,
                             offload_parameters=cfg.offload_parameters, process_group_backend=backend, timeout=timeout)


PRECISION_CASTS = {"64-true": "float64", "64": "float64", "bf16-true": "bfloat16", "16-true": "float16",
                   "transformer-engine": "bfloat16", "transformer-engine-float16": "float16"}
"""Lightning precisions whose plugin casts the whole module (``convert_module``) under every strategy."""
DEEPSPEED_MIXED_CASTS = {"bf16-mixed": "bfloat16", "bf16": "bfloat16", "16-mixed": "float16", "16": "float16"}
"""Mixed precisions under which DeepSpeed's engine casts the module (and keeps fp32 masters in its optimizer)."""
NO_CAST = ("32-true", "32", *DEEPSPEED_MIXED_CASTS)


def trained_weights_dtype(load_dtype: str, precision: str, deepspeed: bool) -> torch.dtype:
    """The dtype of the model's weights (hence of the merged export) under the strategy and precision, from the
    config alone: ``model.torch_dtype`` unless ``*-true``/Transformer Engine, or ``*-mixed`` under DeepSpeed, casts.

    Raises:
        ValueError: a precision Lightning does not know (names the key).
    """
    if precision in PRECISION_CASTS:
        return DTYPES[PRECISION_CASTS[precision]]
    if deepspeed and precision in DEEPSPEED_MIXED_CASTS:
        return DTYPES[DEEPSPEED_MIXED_CASTS[precision]]
    if precision in NO_CAST:
        return DTYPES[load_dtype]
    raise ValueError(f"trainer.precision={precision!r} is not a Lightning precision: one of "
                     f"{sorted({*PRECISION_CASTS, *NO_CAST})}")


def shard_model(model: nn.Module, mesh: DeviceMesh, layer_cls: type[nn.Module] | None,
                reshard_after_forward: bool = True) -> None:
    """FSDP2: ``fully_shard`` every decoder block (``layer_cls``; None: the model's own), then the root.

    Raises:
        UserError: ``layer_cls`` is no block of the model (a config naming another family's class).
    """
    from torch.distributed.fsdp import fully_shard

    layer_cls = checked_layer_class(model, layer_cls)
    for module in model.modules():
        if isinstance(module, layer_cls):
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def checked_layer_class(model: nn.Module, layer_cls: type[nn.Module] | None) -> type[nn.Module]:
    """``layer_cls``, or the model's own block class when None; refused when the model has no such module (FSDP2
    would otherwise shard the whole model as one unit, silently)."""
    own = block_class(model)
    if layer_cls is None:
        return own
    if not any(isinstance(m, layer_cls) for m in model.modules()):
        raise UserError(f"model.decoder_layer_cls={layer_cls.__name__} matches no module of "
                        f"{type(model).__name__}, whose decoder blocks are {own.__name__}",
                        f"set model.decoder_layer_cls=auto (or {own.__name__})", key="model.decoder_layer_cls")
    return layer_cls


def shard_from_rank0(model: nn.Module, mesh: DeviceMesh, layer_cls: type[nn.Module] | None, ctx: DistContext,
                     reshard_after_forward: bool = True) -> None:
    """FSDP2 with the weights on rank 0 alone: shard the ``meta`` structure, then receive the shards
    (``set_model_state_dict(..., broadcast_from_rank0=True)``, torchtitan-style); no other rank holds a full copy."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    with native_layout():  # GPT-2's Conv1D held as nn.Linear: its tensors move as they are in memory
        full = dict(model.state_dict()) if ctx.is_main else {}
        buffers = {n: b.detach().clone() for n, b in model.named_buffers()} if ctx.is_main else {}
        params_to_meta(model)
        shard_model(model, mesh, layer_cls, reshard_after_forward)
        model.to_empty(device=ctx.device)
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        del full
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if ctx.is_main:
                buffer.copy_(buffers[name])
            ctx.broadcast_(buffer, src=0)


def replicate_from_rank0(model: nn.Module, ctx: DistContext, strategy: Strategy | str | None = None) -> None:
    """DDP / DeepSpeed with the weights on rank 0 alone: the other ranks allocate their replica for the wrapper to
    broadcast into; DeepSpeed does not broadcast buffers, so rank 0's are broadcast here (a collective)."""
    if not ctx.is_main:
        model.to_empty(device=ctx.device)
        hf = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
        if hf is not None:
            hf.tie_weights()  # ``to_empty`` gives a tied LM head a tensor of its own
    if isinstance(strategy, DeepSpeedStrategy):
        broadcast_state(model, ctx, parameters=False)


@torch.no_grad()
def broadcast_state(model: nn.Module, ctx: DistContext, parameters: bool = True) -> None:
    """Overwrite every buffer (and, with ``parameters``, every parameter) of ``model`` with rank 0's, one at a time
    through this rank's device."""
    for tensor in [*(model.parameters() if parameters else ()), *model.buffers()]:
        staged = ctx.broadcast_(tensor.to(ctx.device))
        if staged is not tensor:
            tensor.copy_(staged)


def has_meta_parameters(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is on the ``meta`` device (a skeleton waiting for rank 0's weights)."""
    return any(p.is_meta for p in model.parameters())


def full_trainable_state(model: nn.Module) -> dict[str, Any]:
    """FSDP2: the trainable tensors in full, on CPU (``get_model_state_dict``; a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_model_state_dict(model, options=options)


@torch.no_grad()
def gather_trainable(strategy: Strategy | str, model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable tensors of ``model`` in full, on CPU (a collective under sharded strategies: all ranks); under
    DeepSpeed the optimizer's fp32 masters (unrounded under ``bf16-mixed``; ZeRO-3: gathered), a parameter without
    one (fp32 ZeRO-2) being its own."""
    if isinstance(strategy, ModelParallelStrategy):
        return dict(full_trainable_state(model))
    deepspeed = isinstance(strategy, DeepSpeedStrategy)
    if deepspeed:
        from deepspeed.utils import safe_get_full_fp32_param
    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            master = safe_get_full_fp32_param(param) if deepspeed else None
            out[name] = (master if master is not None else param).detach().cpu().clone()
    return out
