"""Which layers are pruned and adapted: the linear projections of a model's decoder blocks, found from the model.

Default: LLaMA's seven projections (paper Sec. 4), elsewhere every linear projection of the blocks (no embeddings)."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from spp.errors import UserError

DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The seven projections of every LLaMA decoder block: pruned by the pruners, adapted by SPP and the baselines
(paper Sec. 4; the authors' ``lora_target_modules``). Left as the default, it stands for the block projections of
whatever architecture is loaded (:func:`resolve_targets`)."""

ATTENTION_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The attention projections (DS⊘T refines only these by default, as its reference code); left as the default it
stands for the projections under the block's attention module."""


def matches(name: str, targets: Iterable[str]) -> bool:
    """True when the module path ``name`` equals a target or ends with ``.<target>``."""
    return any(name == t or name.endswith("." + t) for t in targets)


def is_projection(module: nn.Module) -> bool:
    """An ``nn.Linear`` (subclasses included) or a GPT-2-style ``Conv1D`` (weight stored ``[in, out]``)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(qualified name, ModuleList) of the model's decoder blocks: the first ModuleList with
    ``config.num_hidden_layers`` entries (``ValueError`` when none)."""
    config = getattr(model, "config", None)
    expected = getattr(config, "num_hidden_layers", None)
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and (expected is None or len(module) == expected):
            return name, module
    raise ValueError(
        f"could not find the decoder blocks of {type(model).__name__} (a ModuleList of num_hidden_layers="
        f"{expected} modules); only decoder-only causal LMs are supported"
    )


def block_class(model: nn.Module) -> type[nn.Module]:
    """The class of ``model``'s decoder blocks (what ``_no_split_modules`` names: ``Qwen2DecoderLayer``,
    ``GPT2Block``)."""
    return type(decoder_layers(model)[1][0])


WRAPPED_NAMES: tuple[str, ...] = ("base", "base_layer")
"""Child names under which an adapter layer keeps the projection it wraps (spp's layers, peft's)."""


def _wrapper(path: str, modules: dict[str, nn.Module]) -> str | None:
    """The outermost ancestor of ``path`` that wraps a projection (has a ``base``/``base_layer`` child), if any."""
    parts = path.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if any(w in modules[prefix]._modules for w in WRAPPED_NAMES):
            return prefix
    return None


BLOCK_KEY = re.compile(r"(^|\.)(layers|h|blocks)\.\d+\.")
"""A tensor name inside a decoder block (``model.layers.3.``, ``model.decoder.layers.3.``, GPT-2's
``transformer.h.3.``)."""


def in_blocks(name: str) -> bool:
    """Whether the parameter or tensor name ``name`` lies in a decoder block (read from a checkpoint, no model)."""
    return BLOCK_KEY.search(name) is not None


def block_projections(block: nn.Module) -> dict[str, nn.Module]:
    """The linear projections of one decoder block, by their path inside it (``self_attn.q_proj``); an adapted
    projection is reported once, as its adapter layer under the projection's own path."""
    modules = dict(block.named_modules())
    found: dict[str, nn.Module] = {}
    for name, module in modules.items():
        if name and is_projection(module):
            owner = _wrapper(name, modules)
            found.setdefault(owner or name, modules[owner] if owner else module)
    return found


def leaf_names(paths: Iterable[str]) -> list[str]:
    """The distinct last components of ``paths``, in order."""
    return list(dict.fromkeys(p.rsplit(".", 1)[-1] for p in paths))


def is_default(targets: Iterable[str], default: Iterable[str] = DEFAULT_TARGETS) -> bool:
    """Whether ``targets`` is the default list (in any order)."""
    return set(targets) == set(default)


def is_attention(path: str) -> bool:
    """Whether the in-block path ``path`` lies under an attention module (``self_attn.q_proj``, ``attn.c_proj``)."""
    return any(part.endswith(("attn", "attention")) for part in path.split(".")[:-1])


def resolve_targets(block: nn.Module, targets: Iterable[str], key: str = "pruner.targets") -> list[str]:
    """The target names on a model whose blocks look like ``block``: the default list becomes the block's projection
    names; an explicit list must match linear projections (else a ``UserError`` naming ``key``)."""
    targets = list([targets] if isinstance(targets, str) else targets)
    projections = block_projections(block)
    if is_default(targets):
        return leaf_names(projections)
    kind = type(block).__name__
    fix = f"set {key} to names among {leaf_names(projections)} (or leave it at its default: all of them)"
    if not targets:
        raise UserError(f"{key} is empty", fix, key=key)
    modules = dict(block.named_modules())
    for target in targets:
        hits = [n for n in modules if n and matches(n, [target])]
        if not hits:
            raise UserError(f"{key}: {target!r} matches no module of a {kind} decoder block", fix, key=key)
        if not any(n in projections for n in hits):
            found = type(modules[hits[0]]).__name__
            raise UserError(f"{key}: {target!r} is a {found} in a {kind} decoder block, not a linear projection",
                            fix, key=key)
    return targets


def names_in(model: nn.Module, targets: Iterable[str], key: str = "adapter.targets") -> list[str]:
    """The names to match in ``model``: the default list becomes its block projections' names (kept as they are on
    a module without decoder blocks); an explicit list as given, unchecked."""
    targets = list([targets] if isinstance(targets, str) else targets)
    if not is_default(targets):
        return targets
    try:
        return model_targets(model, targets, key)
    except ValueError:  # no decoder blocks (a unit test's Sequential): the names as given
        return targets


def model_targets(model: nn.Module, targets: Iterable[str], key: str = "adapter.targets") -> list[str]:
    """:func:`resolve_targets` against ``model``'s first decoder block."""
    return resolve_targets(decoder_layers(model)[1][0], targets, key)


def find_projections(model: nn.Module, targets: Iterable[str], key: str = "adapter.targets") -> dict[str, nn.Module]:
    """The linear projections of ``model``'s blocks named by ``targets`` (as :func:`resolve_targets`), in model
    order."""
    try:
        prefix, layers = decoder_layers(model)
    except ValueError:  # a module without decoder blocks (a unit test's Sequential): explicit names anywhere
        return _anywhere(model, targets, key)
    names = resolve_targets(layers[0], targets, key)
    return {f"{prefix}.{i}.{name}": module for i, block in enumerate(layers)
            for name, module in block_linears(block, names).items()}


def _anywhere(model: nn.Module, targets: Iterable[str], key: str) -> dict[str, nn.Module]:
    targets = list([targets] if isinstance(targets, str) else targets)
    found = {n: m for n, m in model.named_modules() if n and is_projection(m) and matches(n, targets)}
    if not found:
        names = leaf_names(n for n, m in model.named_modules() if n and is_projection(m))
        raise UserError(f"{key}={targets} matches no linear projection of {type(model).__name__}",
                        f"set {key} to names among {names}", key=key)
    return found


def block_linears(block: nn.Module, targets: Iterable[str]) -> dict[str, nn.Linear]:
    """Linear projections of one block named by ``targets`` (already resolved: leaf names or in-block paths),
    keyed by their name inside the block."""
    targets = list(targets)
    return {name: module for name, module in block_projections(block).items() if matches(name, targets)}


def current_masks(model: nn.Module, targets: Iterable[str] = DEFAULT_TARGETS) -> dict[str, torch.Tensor]:
    """Nonzero pattern (True = nonzero) of every target linear by qualified name; after SPP injection a pruned
    ``<name>.base.weight`` is reported as ``<name>``."""
    targets = names_in(model, targets, "pruner.targets")
    masks: dict[str, torch.Tensor] = {}
    from_base: set[str] = set()
    for module_name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        is_base = module_name.endswith(".base")
        name = module_name[: -len(".base")] if is_base else module_name
        if not matches(name, targets) or (name in from_base and not is_base):
            continue
        masks[name] = weight.detach() != 0
        if is_base:
            from_base.add(name)
    return masks
