"""Running token batches through an offloaded model one decoder block at a time (pruning and perplexity).

:class:`BlockRunner` drives an :class:`~spp.models.offload.OffloadedModel`:

* :meth:`~BlockRunner.head` onloads what sits before the blocks (embeddings, rotary) and catches, with a forward
  pre-hook on block 0, the hidden states and keyword arguments (attention mask, ``position_embeddings``, ...) the
  model passes its blocks;
* :meth:`~BlockRunner.block` onloads one block (rank 0's weights, broadcast), :meth:`~BlockRunner.run` pushes
  the batches through it;
* :meth:`~BlockRunner.logits` runs the model's own forward with every block replaced by a pass-through that returns the
  final hidden states, so the final norm, the LM head and anything an architecture adds after its blocks run
  unchanged.

Only one block and the activations of this rank's batches are on the device at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from spp.models.offload import OffloadedModel
from spp.pruning.targets import decoder_layers


class _Caught(Exception):
    """Raised by the block-0 pre-hook to stop the forward pass once the inputs are stored."""


class _Replay(nn.Module):
    """Stands in for a decoder block and returns fixed hidden states (as a tuple when the block returns one)."""

    def __init__(self, real: nn.Module, hidden: torch.Tensor, as_tuple: bool) -> None:
        super().__init__()
        self._real = [real]  # a list: not registered as a child module
        self._hidden = [hidden]
        self._as_tuple = as_tuple

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return (self._hidden[0],) if self._as_tuple else self._hidden[0]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._real[0], name)  # per-block attributes such as ``attention_type``


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


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
        return self.off.names_outside(self.prefix)

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
    def head(self, batches: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
        """Hidden states entering block 0 and the keyword arguments the model passes its blocks, per batch."""
        hidden: list[torch.Tensor] = []
        kwargs_list: list[dict[str, Any]] = []

        def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs.pop("hidden_states")
            hidden.append(x.detach())
            kwargs_list.append({k: v for k, v in kwargs.items() if k not in ("past_key_values", "past_key_value")})
            raise _Caught

        handle = self.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            with self.off.onloaded(self.before_blocks):
                for ids in batches:
                    try:
                        self.off.model(input_ids=ids.to(self.device), use_cache=False)
                    except _Caught:
                        pass
        finally:
            handle.remove()
        if len(hidden) != len(batches):
            raise RuntimeError("decoder block 0 was not reached for every batch")
        return hidden, [_to(kw, self.device) for kw in kwargs_list]

    @contextmanager
    def block(self, index: int, write_back: bool = False) -> Iterator[nn.Module]:
        """Decoder block ``index`` onloaded for the duration (its weights written home after, with ``write_back``)."""
        with self.off.onloaded(self.off.names_under(f"{self.prefix}.{index}"), write_back=write_back):
            yield self.layers[index]

    @torch.no_grad()
    def run(self, block: nn.Module, hidden: list[torch.Tensor], kwargs: list[dict[str, Any]]) -> list[torch.Tensor]:
        """Each batch's output hidden states of ``block``."""
        outputs = []
        for x, kw in zip(hidden, kwargs, strict=True):
            out = block(x, **kw)
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
