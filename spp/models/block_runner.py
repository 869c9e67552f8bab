"""Run token batches through an offloaded model one decoder block at a time (pruning and perplexity).

The head records, for each block, the arguments the model passes it (masks, ``position_embeddings``): they differ
between blocks when an architecture mixes sliding-window and full attention (Gemma-2/3, Qwen2/3). Only one block and
this rank's activations are on the device at a time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from spp.models.offload import OffloadedModel
from spp.projections import decoder_layers

Call = tuple[tuple[Any, ...], dict[str, Any]]
"""The arguments after the hidden states, and the keyword arguments, that the model passes one block."""

CACHE_ARGS: frozenset[str] = frozenset({"past_key_values", "past_key_value", "cache", "layer_past"})
"""Keyword arguments not replayed (the KV cache; calibration and scoring run without one)."""


class _Caught(Exception):
    """Raised by the last block's recorder to stop the forward pass once every block's inputs are stored."""


BlockCalls = list[list[Call]]
"""Per block, per batch: the :data:`Call` the model made (``calls[block][batch]``)."""


class _StandIn(nn.Module):
    """Stands in for a decoder block (``_real``, held in a list: not a child module) and reads the block's other
    attributes from it (per-block ones such as ``attention_type``)."""

    _real: list[nn.Module]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._real[0], name)  # per-block attributes such as ``attention_type``


class _Recorder(_StandIn):
    """Stands in for decoder block ``index`` during :meth:`BlockRunner.head`: stores what the model passes it and
    hands the hidden states on unchanged (the last one stops the forward)."""

    def __init__(self, real: nn.Module, index: int, last: bool, calls: BlockCalls, hidden: list[torch.Tensor]):
        super().__init__()
        self._real, self._index, self._last, self._calls, self._hidden = [real], index, last, calls, hidden

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        x, rest = (args[0], args[1:]) if args else (kwargs.pop("hidden_states"), ())
        if self._index == 0:
            self._hidden.append(x.detach())
        self._calls[self._index].append((rest, {k: v for k, v in kwargs.items() if k not in CACHE_ARGS}))
        if self._last:
            raise _Caught
        return x


class _Replay(_StandIn):
    """Stands in for a decoder block and returns fixed hidden states (as a tuple when the block returns one)."""

    def __init__(self, real: nn.Module, hidden: torch.Tensor, as_tuple: bool) -> None:
        super().__init__()
        self._real, self._hidden, self._as_tuple = [real], [hidden], as_tuple

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return (self._hidden[0],) if self._as_tuple else self._hidden[0]


def call_block(block: nn.Module, x: torch.Tensor, call: Call) -> torch.Tensor:
    """``block``'s output hidden states on ``x`` with the arguments the model passes it (a tuple's first item)."""
    args, kw = call
    out = block(x, *args, **kw)
    return out[0] if isinstance(out, tuple) else out


def _to(obj: Any, device: torch.device, memo: dict[int, Any]) -> Any:
    """``obj`` with every tensor on ``device``; a tensor shared by many blocks (a mask) is moved once."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = obj.to(device)
        return memo[id(obj)]
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, device, memo) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device, memo) for k, v in obj.items()}
    return obj


@contextmanager
def in_eval_mode(model: object) -> Iterator[None]:
    """``model`` in eval mode inside the block, then back in the training mode it had on entry (whatever the block
    did to it); anything but a module (a saved folder's path) passes through."""
    if not isinstance(model, nn.Module):
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextmanager
def buffers_on(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Every buffer of ``model`` (rotary frequencies, ...) on ``device`` for the duration, then back."""
    moved = [(b, b.device) for b in model.buffers() if b.device != device and not b.is_meta]
    for buffer, _ in moved:
        buffer.data = buffer.data.to(device)
    try:
        yield
    finally:
        for buffer, home in moved:
            buffer.data = buffer.data.to(home)


class BlockRunner:
    """Runs batches of token ids through ``off``'s model block by block (see the module docstring)."""

    def __init__(self, off: OffloadedModel) -> None:
        self.off = off
        self.prefix, self.layers = decoder_layers(off.model)
        self.device = off.ctx.device
        self.as_tuple = False

    @property
    def outside(self) -> list[str]:
        """Parameters outside the decoder blocks (embeddings, final norm, LM head)."""
        return [n for n in self.off.names if not n.startswith(self.prefix + ".")]

    @property
    def before_blocks(self) -> list[str]:
        """What the head needs: the parameters outside the blocks but the LM head's own (unless it is tied)."""
        head = self.off.model.get_output_embeddings() if hasattr(self.off.model, "get_output_embeddings") else None
        own = {id(p) for p in head.parameters()} if head is not None else set()
        embeddings = self.off.model.get_input_embeddings() if hasattr(self.off.model, "get_input_embeddings") else None
        shared = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
        skip = own - shared
        named = dict(self.off.model.named_parameters(remove_duplicate=False))
        return [n for n in self.outside if id(named[n]) not in skip]

    @torch.no_grad()
    def head(self, batches: list[torch.Tensor]) -> tuple[list[torch.Tensor], BlockCalls]:
        """Hidden states entering block 0 per batch, and what the model passes each block (``calls[i][batch]``)."""
        hidden: list[torch.Tensor] = []
        calls: BlockCalls = [[] for _ in self.layers]
        originals = list(self.layers)
        for i, real in enumerate(originals):
            self.layers[i] = _Recorder(real, i, i == len(originals) - 1, calls, hidden)
        try:
            with self.off.onloaded(self.before_blocks):
                for ids in batches:
                    try:
                        self.off.model(input_ids=ids.to(self.device), use_cache=False)
                    except _Caught:
                        pass
        finally:
            for i, real in enumerate(originals):
                self.layers[i] = real
        if len(hidden) != len(batches) or any(len(c) != len(batches) for c in calls):
            raise RuntimeError("the decoder blocks were not all reached for every batch")
        memo: dict[int, Any] = {}
        for block_calls in calls:
            block_calls[:] = [_to(call, self.device, memo) for call in block_calls]
        return hidden, calls

    @contextmanager
    def block(self, index: int, write_back: bool = False) -> Iterator[nn.Module]:
        """Decoder block ``index`` onloaded for the duration (its weights written home after, with ``write_back``)."""
        with self.off.onloaded(self.off.names_under(f"{self.prefix}.{index}"), write_back=write_back):
            yield self.layers[index]

    @torch.no_grad()
    def run(self, block: nn.Module, hidden: list[torch.Tensor], calls: list[Call]) -> list[torch.Tensor]:
        """Each batch's output hidden states of ``block`` (``calls``: what the model passes it, per batch)."""
        outputs = []
        for x, (args, kw) in zip(hidden, calls, strict=True):
            out = block(x, *args, **kw)
            self.as_tuple = isinstance(out, tuple)
            outputs.append(out[0] if self.as_tuple else out)
        return outputs

    @torch.no_grad()
    def logits(self, hidden: list[torch.Tensor], batches: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """The model's logits for each batch whose last block produced ``hidden`` (the model's own tail)."""
        originals = list(self.layers)
        with self.off.onloaded(self.outside):
            for h, ids in zip(hidden, batches, strict=True):
                for i, real in enumerate(originals):
                    self.layers[i] = _Replay(real, h, self.as_tuple)
                try:
                    yield self.off.model(input_ids=ids.to(self.device), use_cache=False).logits
                finally:
                    for i, real in enumerate(originals):
                        self.layers[i] = real
