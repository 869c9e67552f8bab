"""What every adapter method provides (the registry's interface), and the helpers they share.

A method is a folder whose ``__init__`` registers an :class:`AdapterMethod`, plus ``conf/adapter/<name>.yaml``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from spp.adapters.config import AdapterConfig
from spp.atomic import write_file_atomic, write_text_atomic
from spp.errors import UserError
from spp.projections import find_projections
from spp.version import __version__

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

WRAPPER_PREFIX = "base_model.model."
"""What peft's ``PeftModel`` puts before the plain model's names: its module paths and its adapter files' keys."""


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
    params = list(model.parameters())  # parameters() yields a shared tensor once
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return ParamCounts(trainable, sum(p.numel() for p in params) - trainable)


class LinearWrapper(nn.Module):
    """A layer wrapping a frozen ``self.base`` linear whose shape and tensors read through (``layer.weight``)."""

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
    """A method as a registered peft method: peft name, config/tuner classes, tensor prefix, ``spp.peft`` exports."""

    name: str
    config_class: type
    model_class: type
    prefix: str
    exports: tuple[Any, ...] = ()


class AdapterMethod(ABC):
    """One way to fine-tune a pruned model, registered by its folder's ``__init__``.

    ``kept_zeros_may_change``: the merge may fill kept weights that were exactly zero (pruned ones always stay zero);
    ``zero3_refusal``: why it cannot train under ZeRO-3 (``None`` if it can); ``reconstruct_lr``: its default lr in
    block-wise reconstruction (``docs/reconstruction.md``).
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[AdapterConfig]] = AdapterConfig
    trains: ClassVar[bool] = True
    kept_zeros_may_change: ClassVar[bool] = False
    zero3_refusal: ClassVar[str | None] = None
    reconstruct_lr: ClassVar[float] = 1e-2
    summed_stats: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def inject(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> nn.Module:
        """Attach the adapter (only its parameters require grad); ``masks`` may be empty, ``model`` on ``meta``."""

    @abstractmethod
    def merge(self, model: nn.Module, cfg: AdapterConfig, masks: Masks) -> tuple[nn.Module, dict[str, Any]]:
        """Fold the adapter into plain ``nn.Linear`` weights; returns the model and what the merge reports."""

    @abstractmethod
    def save(self, model: nn.Module, directory: Path, extra: dict[str, Any]) -> None:
        """Write the adapter files into ``directory`` (which exists and is empty)."""

    @abstractmethod
    def load(self, model: nn.Module, directory: Path, masks: Masks) -> tuple[nn.Module, AdapterConfig]:
        """The base ``model`` with the adapter :meth:`save` wrote (unmerged) and its config; UserError if not ours."""

    def needs_dense(self, cfg: AdapterConfig) -> bool:
        """Whether :meth:`prepare` must complete ``cfg`` from the dense model first (LoSA). Default: no."""
        return False

    def prepare(self, cfg: AdapterConfig, dense: nn.Module, pruned: nn.Module,
                batches: list[torch.Tensor]) -> dict[str, Any]:
        """Config keys to set from the ``dense`` and ``pruned`` models (rank 0's CPU) on calibration ``batches``."""
        return {}

    @contextmanager
    def refusing_other_files(self, directory: Path, what: str = "",
                             errors: tuple[type[Exception], ...] = (FileNotFoundError, ValueError)) -> Iterator[None]:
        """Turn ``errors`` of reading ``directory`` into :meth:`load`'s one-line refusal (``what``: what it is not)."""
        try:
            yield
        except UserError:  # already one line naming the file and its fix (a damaged file: read_json_file)
            raise
        except errors as err:
            fix = f"point adapter_dir= at the adapter folder of an adapter={self.name} run on this pruned model"
            raise UserError(f"adapter_dir={str(directory)!r}{what}: {err}", fix, key="adapter_dir",
                            path=directory) from err

    def effective_weight(self, module: nn.Module, full: Full) -> torch.Tensor | None:
        """The weight an adapted ``module`` applies (for the sparsity audit), else ``None``; ``full`` unshards."""
        return None

    def merged_layer(self, module: nn.Module, mask: torch.Tensor | None) -> MergedLayer | None:
        """An adapted ``module``'s merged weights and stats (streamed export, one whole layer), else ``None``."""
        return None

    def merge_summary(self, layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """What :meth:`merge` reports from every layer's :attr:`MergedLayer.stats`: default ``{"layers"}`` and the
        sums of :attr:`summed_stats` (``{}`` without them)."""
        if not self.summed_stats:
            return {}
        return {"layers": len(layers), **{k: sum(s[k] for s in layers.values()) for k in self.summed_stats}}

    def trained_parameters(self, model: nn.Module, sparsity: float | None = None) -> int:
        """Parameters training changes (Table 1); ``sparsity`` serves methods on ``meta`` where masks are unknown."""
        return count_parameters(model).trainable

    def train_flops(self, adapted_weights: int, trainable: int, dropout: float) -> int:
        """The method's own work per training token beyond the frozen base (``spp.planning.flops``).

        Default ``6 x trainable``: its tensors' forward and backward, as a LoRA factor.
        """
        return 6 * trainable

    def resident_terms(self, adapted_weights: int) -> dict[str, int]:
        """Bytes its layers keep on every device beside the weights, unsharded, by term. Default: none."""
        return {}

    def forward_transient_values(self, largest_weight: int) -> int:
        """Values its forward keeps until backward for the largest adapted linear. Default: none."""
        return 0

    def backward_transient_bytes(self, largest_weight: int) -> int:
        """Bytes its backward builds at once for one adapted linear (the largest). Default: none."""
        return 0

    def keeps_merged_weights(self, cfg: AdapterConfig) -> bool:
        """Whether every adapted linear keeps a merged weight copy forward to backward. Default: no."""
        return False

    def preflight(self, cfg: AdapterConfig, shapes: Shapes | None) -> None:
        """Refuse (UserError naming key and fix) a config that cannot work, before loading (``shapes`` or None)."""
        return

    def rank(self, cfg: AdapterConfig) -> int | None:
        """The method's size knob for run names and tables (``r``), ``None`` when it has none."""
        value = getattr(cfg, "r", None)
        return int(value) if value is not None else None

    def external_parameters(self, model: nn.Module) -> ExternalParameters:
        """Parameters a module reads without calling their owner, with that reader (ZeRO-3 must gather them)."""
        return []

    def after_placement(self, model: nn.Module) -> None:
        """Re-attach what replica materialisation lost (masked full's hooks); not called under FSDP2."""
        return

    def before_optimizer_step(self, model: nn.Module) -> None:
        """Called before every optimizer step (and gradient clipping). Default: nothing."""
        return

    def peft_integration(self) -> PeftIntegration | None:
        """The method as a peft method (registered by ``import spp.peft``), or ``None``."""
        return None


def linear_tensors(linear: nn.Module) -> dict[str, torch.Tensor]:
    """``{"weight", "bias"}`` of a plain linear layer (detached; no bias key without a bias)."""
    out = {"weight": linear.weight.detach()}
    if getattr(linear, "bias", None) is not None:
        out["bias"] = linear.bias.detach()
    return out


def check_masks_cover(label: str, names: Iterable[str], masks: Masks | None) -> None:
    """``ValueError`` naming the adapted layers ``names`` that given ``masks`` hold no pruning mask for."""
    missing = sorted(set(names) - set(masks or {}))
    if masks and missing:
        raise ValueError(f"{label}: no pruning mask for {len(missing)} adapted layer(s), e.g. {missing[:3]}; "
                         "prune the layers that adapter.targets names")


def wrapper_reads(layers: Iterable[LinearWrapper]) -> ExternalParameters:
    """``(layer, base.weight/bias)`` pairs: a :class:`LinearWrapper`'s forward reads them without calling ``base``."""
    return [(layer, p) for layer in layers for p in (layer.base.weight, layer.base.bias) if p is not None]


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
    """The decoder-block linear projections ``targets`` names, by path (UserError if one matches nothing)."""
    return find_projections(model, targets, "adapter.targets")


def wrap_targets(model: nn.Module, targets: Iterable[str], wrapper: type[LinearWrapper], label: str, merge: str,
                 **kwargs: Any) -> nn.Module:
    """Replace every targeted ``nn.Linear`` by ``wrapper(linear, name=<path>, **kwargs)`` in model order and freeze
    the rest, in place; ValueError (naming ``merge``, the function that takes them out) when it holds some already."""
    if any(isinstance(m, wrapper) for m in model.modules()):
        raise ValueError(f"{label}: the model already holds {wrapper.__name__} layers; call {merge} first")
    found = find_projections(model, targets, "adapter.targets")
    freeze_all(model)
    for name, linear in found.items():
        set_submodule(model, name, wrapper(linear, name=name, **kwargs))
    return model


def copy_tensors(state: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], label: str) -> None:
    """Copy the file's tensors ``state`` into the model's ``targets`` bit for bit; ValueError, before any copy, when
    their names or a shape differ."""
    file_only, model_only = sorted(set(state) - set(targets)), sorted(set(targets) - set(state))
    if file_only or model_only:
        raise ValueError(f"{label}: tensor names differ: file-only {file_only[:5]}, model-only {model_only[:5]}; load "
                         "it on the model (and settings) it was trained with")
    for key, target in targets.items():
        if tuple(state[key].shape) != tuple(target.shape):
            raise ValueError(f"{label}: {key} has shape {tuple(state[key].shape)} in the file but "
                             f"{tuple(target.shape)} in the model (another architecture or setting)")
    with torch.no_grad():
        for key, target in targets.items():
            target.copy_(state[key])


def read_adapter_files(directory: str | Path, meta_name: str, weights_name: str, fmt: str,
                       what: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The JSON record (its ``format`` must be ``fmt``) and the bit-exact tensors a method's ``save`` wrote."""
    path = Path(directory)
    if not (path / meta_name).is_file() or not (path / weights_name).is_file():
        raise FileNotFoundError(f"no {meta_name} and {weights_name} in {directory}; expected {what} adapter files")
    meta = read_json_file(path / meta_name)
    if meta.get("format") != fmt:
        raise ValueError(f"{path / meta_name} is not a {what} adapter (format={meta.get('format')!r})")
    return meta, load_tensor_file(path / weights_name)


def write_json_file(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON with sorted keys, written atomically (every JSON file of an adapter folder)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_record(path: Path, fmt: str, extra: dict[str, Any] | None, **fields: Any) -> None:
    """A method's JSON record (its ``format`` ``fmt``, spp's version, ``fields`` and the caller's ``extra``)."""
    write_json_file(path, {"format": fmt, "spp_version": __version__, **fields, "extra": extra or {}})


def save_tensor_file(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """``tensors`` (made contiguous) as a safetensors file, written atomically (:func:`load_tensor_file` reads it)."""
    from safetensors.torch import save_file

    contiguous = {k: v.contiguous() for k, v in tensors.items()}
    write_file_atomic(path, lambda tmp: save_file(contiguous, str(tmp), metadata={"format": "pt"}))


DAMAGED_FIX = "copy the adapter folder again from the run that wrote it (<run_dir>/adapter), or train it again"
"""What to do about a damaged (e.g. truncated) adapter file."""


def read_json_file(path: str | Path, key: str = "adapter_dir") -> dict[str, Any]:
    """A JSON file of an adapter folder; UserError naming it when damaged."""
    try:
        return json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is damaged (not valid JSON: {err})", DAMAGED_FIX, key=key, path=path) from err


def check_tensor_file(path: str | Path, key: str = "adapter_dir") -> None:
    """Check a safetensors header parses and covers the file (no tensor read); UserError when damaged."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt"):
            pass
    except Exception as err:  # SafetensorError is a bare Exception
        raise UserError(f"{path} is damaged ({err})", DAMAGED_FIX, key=key, path=path) from err


def load_tensor_file(path: str | Path, key: str = "adapter_dir") -> dict[str, torch.Tensor]:
    """``safetensors.torch.load_file`` of an adapter file (bit-exact); UserError when damaged."""
    from safetensors.torch import load_file

    check_tensor_file(path, key)
    return load_file(str(path))
