"""What every adapter method provides (the registry's interface), and the helpers they share.

A method is one folder (``spp/adapters/methods/<name>/``, or a plug-in's folder named in ``SPP_PLUGINS``) whose
``__init__`` calls :func:`spp.adapters.registry.register` with an :class:`AdapterMethod`, plus one YAML
(``conf/adapter/<name>.yaml``). Everything else in the project (training, the sparsity audit, the streamed export,
``eval.py adapter_dir=``, the preflight, Table 1, the studies' tables) asks the method through this interface.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from spp.adapters.config import AdapterConfig
from spp.errors import UserError
from spp.projections import find_projections

Masks = dict[str, torch.Tensor]
"""Pruning masks (True = kept) keyed by the original linear names (``model.layers.0.self_attn.q_proj``)."""

ExternalParameters = list[tuple[nn.Module, nn.Parameter]]
"""``(reader, parameter)`` pairs: ``reader``'s forward (and so its backward) reads ``parameter`` of another module
without calling that module (what DeepSpeed ZeRO-3 must gather for it: ``register_external_parameter``)."""

Full = Callable[[torch.Tensor], torch.Tensor]
"""Turns a (possibly sharded) tensor of a gathered layer into the whole tensor (``spp.gathering.Gatherer.full``)."""

Shapes = dict[str, tuple[int, int]]
"""``(in_features, out_features)`` of the adapted projections of one decoder block, by leaf name (``q_proj``)."""

__all__ = ["AdapterMethod", "ExternalParameters", "Full", "Masks", "MergedLayer", "ParamCounts", "PeftIntegration",
           "Shapes", "check_tensor_file", "count_parameters", "freeze_all", "linear_tensors", "load_tensor_file",
           "read_json_file", "set_submodule", "target_linears", "CONFIG_NAME", "WEIGHTS_NAME"]

CONFIG_NAME = "adapter_config.json"
"""The settings file of an adapter folder (peft's name, so peft reads spp's folders)."""

WEIGHTS_NAME = "adapter_model.safetensors"
"""The tensors file of an adapter folder (peft's name)."""


class ParamCounts(NamedTuple):
    """Trainable and frozen parameter counts (each shared tensor counted once)."""

    trainable: int
    frozen: int

    @property
    def total(self) -> int:
        """All parameters."""
        return self.trainable + self.frozen

    def to_dict(self) -> dict[str, int]:
        """``{"trainable", "frozen", "total"}`` (the summary's ``params``)."""
        return {"trainable": self.trainable, "frozen": self.frozen, "total": self.total}


def count_parameters(model: nn.Module) -> ParamCounts:
    """Count trainable and frozen parameters of ``model`` (tied tensors once)."""
    seen: set[int] = set()
    trainable = frozen = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
    return ParamCounts(trainable, frozen)


class LinearWrapper(nn.Module):
    """A layer wrapping a frozen ``self.base`` linear: its shape and tensors read through (``layer.weight`` is the
    pruned weight, as code that inspects ``nn.Linear`` attributes expects)."""

    base: nn.Module

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias


class MergedLayer(NamedTuple):
    """One adapted layer merged: its plain tensors (``weight``, ``bias``) and what the merge reports of it."""

    tensors: dict[str, torch.Tensor]
    stats: dict[str, Any] = {}


class PeftIntegration(NamedTuple):
    """A method as a registered peft method (``spp.peft`` registers it on import): its name for peft
    (``PeftType.<NAME>``, ``"peft_type"`` in ``adapter_config.json``), peft config and tuner classes, the prefix of
    its tensors' names, and what ``spp.peft`` exports for it (each under its ``__name__``)."""

    name: str
    config_class: type
    model_class: type
    prefix: str
    exports: tuple[Any, ...] = ()


class AdapterMethod(ABC):
    """One way to fine-tune a pruned model, registered by its folder's ``__init__``.

    Attributes:
        name: The ``adapter.name`` value (and ``conf/adapter/<name>.yaml``).
        config_class: Its config dataclass (a subclass of :class:`~spp.adapters.config.AdapterConfig`), stored in
            Hydra's ConfigStore as ``adapter/<name>_schema``.
        trains: Whether the method has a training loop (``none`` has not).
        kept_zeros_may_change: The merge may fill kept weights that happened to be exactly zero (LoRA*
            re-masking); pruned positions must stay zero for every method.
        zero3_refusal: Why the method cannot train under DeepSpeed ZeRO-3 (``strategy=deepspeed_stage3``), or
            ``None`` when it can (the preflight refuses the job in one line otherwise).
        reconstruct_lr: The learning rate block-wise reconstruction uses with this method as its trainable form
            when ``reconstruct.lr`` is null (``docs/reconstruction.md``).
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[AdapterConfig]] = AdapterConfig
    trains: ClassVar[bool] = True
    kept_zeros_may_change: ClassVar[bool] = False
    zero3_refusal: ClassVar[str | None] = None
    reconstruct_lr: ClassVar[float] = 1e-2

    # ----------------------------------------------------------------------------------------- the life cycle
    @abstractmethod
    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        """Attach the adapter; afterwards exactly the adapter's parameters require grad. ``masks`` may be empty
        (the pruned weights' non-zeros then stand for them); ``model`` may live on the ``meta`` device (Table 1)."""

    @abstractmethod
    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        """Fold the adapter into plain ``nn.Linear`` weights; returns the model and what the merge reports."""

    @abstractmethod
    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        """Write the adapter files into ``directory`` (which exists and is empty)."""

    @abstractmethod
    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """The pruned base ``model`` with the adapter :meth:`save` wrote into ``directory`` (unmerged), and the
        config it was trained with (as far as :meth:`merge` needs it).

        Raises:
            spp.errors.UserError: the files do not belong to this method or to this model (naming ``adapter_dir``).
        """

    def needs_dense(self, cfg: AdapterConfig) -> bool:
        """Whether ``cfg`` is completed from the dense and the pruned model before :meth:`inject` (:meth:`prepare`;
        LoSA's per-block errors when not given): the training pipeline's pruning phase then keeps a dense copy
        until it is. Default: no."""
        return False

    def prepare(self, cfg: AdapterConfig, dense: nn.Module, pruned: nn.Module,
                batches: list[torch.Tensor]) -> dict[str, Any]:
        """When :meth:`needs_dense`: the config keys to set from the ``dense`` and ``pruned`` models (whole, on rank
        0's CPU) on the calibration token ``batches``; the pipeline sets them on the job's config on every rank
        before :meth:`inject`."""
        return {}

    def wrong_adapter_dir(self, directory: Path, err: Exception) -> UserError:
        """The one-line refusal of :meth:`load` when ``directory`` does not hold this method's files for this
        model (``err`` says what is wrong)."""
        return UserError(f"adapter_dir={str(directory)!r}: {err}", f"point adapter_dir= at the adapter folder of an "
                         f"adapter={self.name} run on this pruned model", key="adapter_dir", path=directory)

    # ----------------------------------------------------------------------------------------- views of a layer
    def effective_weight(self, module: nn.Module, full: Full) -> torch.Tensor | None:
        """The weight ``module`` applies (what the sparsity audit checks), when it is one of this method's adapted
        layers, from its gathered parameters (``full`` turns a shard into the whole tensor); else ``None`` (a plain
        ``nn.Linear`` is audited on its own weight)."""
        return None

    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """``module``'s weights as :meth:`merge` writes them, with what the merge reports of this layer, when
        ``module`` is one of this method's adapted layers; else ``None``.

        The streamed export (``spp.export.merged``) calls it one layer at a time on whole (unsharded) layers, so a
        model is never merged whole; ``module`` itself is left as it is. ``mask`` is the layer's pruning mask
        (True = kept). The default: the method adapts no layer.
        """
        return None

    def merge_summary(self, layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """What :meth:`merge` reports, from every layer's :attr:`MergedLayer.stats` by layer name (default: ``{}``)."""
        return {}

    # ----------------------------------------------------------------------------------------- what it trains
    def trained_parameters(self, model: nn.Module, sparsity: float | None = None) -> int:
        """Parameters training changes in the injected ``model`` (Table 1's "trainable"); default: every parameter
        that requires grad. ``sparsity`` (the pruned fraction) is for methods that train only the kept weights of
        a model on the ``meta`` device, where the masks are unknown."""
        return count_parameters(model).trainable

    def train_flops(self, adapted_weights: int, trainable: int, dropout: float) -> int:
        """The method's own work per training token, beyond the frozen base's forward and backward (what the run
        plan's time counts, ``spp.planning.flops``): ``adapted_weights`` are the weights of the adapted linears over
        the model, ``trainable`` its trainable values. Default ``6 x trainable`` (its tensors' forward, and backward
        to their inputs and to themselves, as a LoRA factor)."""
        return 6 * trainable

    def resident_terms(self, adapted_weights: int) -> dict[str, int]:
        """Bytes its layers keep on every device beside the weights, never sharded, by term (the run plan's); the
        adapted linears hold ``adapted_weights`` weights over the model. Default: none."""
        return {}

    def forward_transient_values(self, largest_weight: int) -> int:
        """Values (in the activations' dtype) its forward builds for one adapted linear and keeps until backward;
        the run plan counts the largest linear, of ``largest_weight`` weights. Default: none."""
        return 0

    def backward_transient_bytes(self, largest_weight: int) -> int:
        """Bytes its backward builds at once for one adapted linear (the largest). Default: none."""
        return 0

    def keeps_merged_weights(self, cfg: AdapterConfig) -> bool:
        """Whether every adapted linear keeps a merged copy of its weight from forward to backward (the run plan's
        ``cached_weights``). Default: no."""
        return False

    def preflight(self, cfg: AdapterConfig, shapes: Shapes | None) -> None:
        """Refuse (:class:`~spp.errors.UserError` naming the key and the fix) a config that cannot work, before any
        weight is loaded: its values against each other and against the adapted projections' ``shapes`` (``None``
        when the model's shape is unknown before loading). Default: nothing to check."""
        return

    def rank(self, cfg: AdapterConfig) -> int | None:
        """The method's size knob for run names and tables (``r``), ``None`` when it has none."""
        value = getattr(cfg, "r", None)
        return int(value) if value is not None else None

    # ----------------------------------------------------------------------------------------- training hooks
    def external_parameters(self, model: nn.Module) -> ExternalParameters:
        """Every parameter a module of the injected ``model`` reads without calling the module that owns it, with
        that reader (:data:`ExternalParameters`). ZeRO-3 gathers a module's own parameters around its forward and
        backward only, so these must be registered for their reader. Default: none (every read goes through the
        owner's own forward, as peft LoRA's ``lora_A(x)`` does)."""
        return []

    def after_placement(self, model: nn.Module) -> None:
        """Called once every rank holds its replica (one process, DDP, DeepSpeed; not FSDP2, whose sharded weights
        autograd does not see): what the method attached to parameter objects that materialising a replica replaced
        is put back (masked full's gradient hooks). Default: nothing."""
        return

    def before_optimizer_step(self, model: nn.Module) -> None:
        """Called before every optimizer step (and gradient clipping). Default: nothing."""
        return

    # ----------------------------------------------------------------------------------------- outside spp
    def peft_integration(self) -> PeftIntegration | None:
        """The method as a peft method (``import spp.peft`` registers it with peft), or ``None``. Default: none."""
        return None


def linear_tensors(linear: nn.Module) -> dict[str, torch.Tensor]:
    """``{"weight", "bias"}`` of a plain linear layer (detached; no bias key without a bias)."""
    out = {"weight": linear.weight.detach()}
    if getattr(linear, "bias", None) is not None:
        out["bias"] = linear.bias.detach()
    return out


def freeze_all(model: nn.Module) -> None:
    """Set ``requires_grad=False`` on every parameter of ``model``."""
    for p in model.parameters():
        p.requires_grad_(False)


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put ``module`` at the path ``name`` of ``model`` (replacing what is there)."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def target_linears(model: nn.Module, targets: tuple[str, ...] | list[str]) -> dict[str, nn.Linear]:
    """The linear projections of ``model``'s decoder blocks that ``targets`` names, by path (the default targets
    stand for all of them: :func:`spp.projections.find_projections`).

    Raises:
        UserError: ``targets`` is empty, or a name matches no linear projection (names the ones there are).
    """
    return find_projections(model, targets, "adapter.targets")


def read_adapter_files(directory: str | Path, meta_name: str, weights_name: str, fmt: str,
                       what: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The JSON record ``meta_name`` (whose ``format`` must be ``fmt``) and the tensors of ``weights_name`` that a
    method's ``save`` wrote into ``directory`` (bit-exact).

    Raises:
        FileNotFoundError: a file is missing. ValueError: the record is of another format.
    """
    path = Path(directory)
    if not (path / meta_name).is_file() or not (path / weights_name).is_file():
        raise FileNotFoundError(f"no {meta_name} and {weights_name} in {directory}; expected {what} adapter files")
    meta = read_json_file(path / meta_name)
    if meta.get("format") != fmt:
        raise ValueError(f"{path / meta_name} is not a {what} adapter (format={meta.get('format')!r})")
    return meta, load_tensor_file(path / weights_name)


DAMAGED_FIX = "copy the adapter folder again from the run that wrote it (<run_dir>/adapter), or train it again"
"""What to do about a damaged (e.g. truncated) adapter file."""


def read_json_file(path: str | Path, key: str = "adapter_dir") -> dict[str, Any]:
    """A JSON file of an adapter folder.

    Raises:
        UserError: not valid JSON (a truncated copy), naming the file.
    """
    try:
        return json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is damaged (not valid JSON: {err})", DAMAGED_FIX, key=key, path=path) from err


def check_tensor_file(path: str | Path, key: str = "adapter_dir") -> None:
    """A safetensors file's header parses and covers the whole file (cheap: no tensor is read).

    Raises:
        UserError: truncated or not a safetensors file, naming it.
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt"):
            pass
    except Exception as err:  # SafetensorError is a bare Exception
        raise UserError(f"{path} is damaged ({err})", DAMAGED_FIX, key=key, path=path) from err


def load_tensor_file(path: str | Path, key: str = "adapter_dir") -> dict[str, torch.Tensor]:
    """``safetensors.torch.load_file`` of an adapter file (bit-exact).

    Raises:
        UserError: truncated or not a safetensors file, naming it.
    """
    from safetensors.torch import load_file

    check_tensor_file(path, key)
    return load_file(str(path))
