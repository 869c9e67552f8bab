"""Build Lightning's own DDP / FSDP / DeepSpeed strategy objects from the ``strategy`` group."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, Strategy

from spp.training.config import STRATEGIES, StrategyConfig


def decoder_layer_class(name: str) -> type[torch.nn.Module]:
    """Resolve a decoder-layer class name (``model.decoder_layer_cls``) from ``transformers``.

    Args:
        name: A class name exported by ``transformers`` (``LlamaDecoderLayer``) or a dotted path
            (``transformers.models.llama.modeling_llama.LlamaDecoderLayer``).

    Raises:
        ValueError: the class cannot be found (names the config key).
    """
    import transformers

    module_name, _, cls_name = name.rpartition(".")
    candidates = [module_name] if module_name else []
    if not module_name:
        family = name.split("DecoderLayer")[0].lower()
        candidates += [f"transformers.models.{family}.modeling_{family}"]
    cls = None if module_name else getattr(transformers, name, None)
    for candidate in candidates:
        if cls is not None:
            break
        try:
            cls = getattr(importlib.import_module(candidate), cls_name or name, None)
        except ImportError:
            cls = None
    if cls is None:
        raise ValueError(
            f"model.decoder_layer_cls={name!r} is not a class in transformers; give e.g. LlamaDecoderLayer "
            "or a dotted path (transformers.models.llama.modeling_llama.LlamaDecoderLayer)"
        )
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ValueError(f"model.decoder_layer_cls={name!r} is not an nn.Module class")
    return cls


def _backend(cfg: StrategyConfig, accelerator: str) -> str | None:
    if cfg.process_group_backend:
        return cfg.process_group_backend
    if accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()):
        return "gloo"
    return None


def build_strategy(cfg: StrategyConfig, decoder_layer_cls: str, accelerator: str = "auto") -> Strategy | str:
    """Instantiate the Lightning strategy named by ``cfg.name``.

    FSDP keeps frozen base weights and trainable SPP tensors out of one flat parameter: ``use_orig_params``
    lets a unit hold parameters with different ``requires_grad``, and the auto-wrap policy over the decoder
    layer class makes each decoder block its own unit (activation checkpointing uses the same class).

    Args:
        cfg: The ``strategy`` group.
        decoder_layer_cls: ``model.decoder_layer_cls`` (FSDP wrapping and activation checkpointing).
        accelerator: ``trainer.accelerator`` (CPU runs default to the ``gloo`` backend).

    Returns:
        ``"auto"`` or a Lightning ``Strategy``.

    Raises:
        ValueError: an unknown strategy name.
        ImportError: DeepSpeed is requested but not installed (with the install command).
    """
    if cfg.name not in STRATEGIES:
        raise ValueError(f"strategy.name={cfg.name!r}: use one of {STRATEGIES}")
    if cfg.name == "auto":
        return "auto"
    backend = _backend(cfg, accelerator)
    if cfg.name == "ddp":
        return DDPStrategy(process_group_backend=backend, find_unused_parameters=cfg.find_unused_parameters)
    if cfg.name == "fsdp":
        layer_cls = decoder_layer_class(decoder_layer_cls)
        kwargs: dict[str, Any] = {
            "process_group_backend": backend,
            "sharding_strategy": cfg.sharding_strategy,
            "state_dict_type": cfg.state_dict_type,
            "use_orig_params": cfg.use_orig_params,
            "cpu_offload": cfg.cpu_offload,
        }
        if cfg.wrap_decoder_layers:
            kwargs["auto_wrap_policy"] = {layer_cls}
        if cfg.activation_checkpointing:
            kwargs["activation_checkpointing_policy"] = {layer_cls}
        return FSDPStrategy(**kwargs)
    if importlib.util.find_spec("deepspeed") is None:
        raise ImportError(
            f"strategy={cfg.name} (ZeRO stage {cfg.stage}) needs DeepSpeed, which is not installed; run "
            "`pip install deepspeed` on a GPU machine, or choose strategy=ddp / strategy=fsdp"
        )
    return DeepSpeedStrategy(
        stage=cfg.stage,
        offload_optimizer=cfg.offload_optimizer,
        offload_parameters=cfg.offload_parameters,
        process_group_backend=backend,
    )


def is_sharded(strategy: Strategy | str) -> bool:
    """Whether parameters are sharded across ranks (FSDP, DeepSpeed ZeRO-3), so audits need a gather."""
    if isinstance(strategy, FSDPStrategy):
        return True
    return isinstance(strategy, DeepSpeedStrategy) and getattr(strategy, "zero_stage_3", False)
