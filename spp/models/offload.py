"""A model whose weights stay off the compute device: a ``meta`` skeleton on every rank, the weights on rank 0's host.

The pruning phase's placement (as llm-compressor's sequential pipeline): a block is onloaded when needed (rank 0
copies it to its device and broadcasts it) and offloaded back to rank 0's home, so a model is never whole on an
accelerator and other ranks never hold a copy of the weights."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from spp.distributed import DistContext


def params_to_meta(model: nn.Module) -> None:
    """Replace every parameter of ``model`` by a ``meta`` one of the same shape, dtype and ``requires_grad``
    (tied parameters stay tied; buffers are left as they are)."""
    modules = dict(model.named_modules(remove_duplicate=False))
    replaced: dict[int, nn.Parameter] = {}
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        owner, _, attr = name.rpartition(".")
        if id(param) not in replaced:
            meta = torch.empty_like(param, device="meta")
            replaced[id(param)] = nn.Parameter(meta, requires_grad=param.requires_grad)
        modules[owner]._parameters[attr] = replaced[id(param)]


class OffloadedModel:
    """``model`` as a skeleton whose parameters rank 0 keeps at home (not copied; other ranks' are dropped).

    Tied parameters (an LM head sharing the embedding) stay one tensor under their first name. The first collective
    goes through ``ctx``'s wait group when one was made before rank 0 started loading."""

    def __init__(self, model: nn.Module, ctx: DistContext) -> None:
        self.model = model
        self.ctx = ctx
        self.home: dict[str, torch.Tensor] = {}
        self._slots: dict[str, list[tuple[nn.Module, str]]] = {}
        self._meta: dict[str, nn.Parameter] = {}
        self._names: dict[str, str] = {}
        self._grad: dict[str, bool] = {}
        first: dict[int, str] = {}
        modules = dict(model.named_modules(remove_duplicate=False))
        for name, param in model.named_parameters(remove_duplicate=False):
            owner, _, attr = name.rpartition(".")
            canonical = first.setdefault(id(param), name)
            self._names[name] = canonical
            self._slots.setdefault(canonical, []).append((modules[owner], attr))
            if canonical == name:
                if ctx.is_main:
                    if param.is_meta:
                        raise ValueError(f"rank 0 must hold the weights, but {name} is on the meta device")
                    self.home[name] = param.detach()
                self._meta[name] = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=False)
                self._grad[name] = param.requires_grad
        for canonical in self._slots:
            self._place(canonical, self._meta[canonical])
        # the first collective after loading: the other ranks waited here while rank 0 read the weights
        layouts = ctx.gather_objects([(n, tuple(p.shape), str(p.dtype)) for n, p in self._meta.items()],
                                     long_wait=True)
        if any(layout != layouts[0] for layout in layouts):
            raise RuntimeError("the ranks built different models (parameter names, shapes, dtypes or tying differ); "
                               "every rank must load the same model.* settings")
        for buffer in model.buffers():  # rotary frequencies and the like: rank 0's values everywhere
            if ctx.distributed and not buffer.is_meta:
                buffer.data = ctx.broadcast_(buffer.data.to(ctx.device), src=0).to(buffer.device)

    # ------------------------------------------------------------------ names
    @property
    def names(self) -> list[str]:
        """Canonical parameter names, in module order."""
        return list(self._slots)

    def names_under(self, prefix: str) -> list[str]:
        """Canonical names of the parameters inside module ``prefix`` (e.g. ``model.layers.3``)."""
        return [n for n in self._slots if n.startswith(prefix + ".")]

    def canonical(self, name: str) -> str:
        """The canonical name of any (possibly tied) parameter name."""
        return self._names[name]

    # ------------------------------------------------------------------ moving
    def _place(self, canonical: str, param: nn.Parameter) -> None:
        for module, attr in self._slots[canonical]:
            module._parameters[attr] = param

    def _current(self, canonical: str) -> torch.Tensor:
        module, attr = self._slots[canonical][0]
        return module._parameters[attr]

    def onload(self, names: Iterable[str], device: torch.device | None = None) -> None:
        """Give parameters ``names`` real storage on ``device`` (rank 0's home, broadcast to the other ranks)."""
        device = torch.device(device) if device is not None else self.ctx.device
        for name in names:
            meta = self._meta[name]
            if self.ctx.is_main:
                home = self.home[name]
                tensor = home if home.device == device else home.to(device, copy=True)
            else:
                tensor = torch.empty(meta.shape, dtype=meta.dtype, device=device)
            self.ctx.broadcast_(tensor, src=0)
            self._place(name, nn.Parameter(tensor, requires_grad=False))

    def offload(self, names: Iterable[str], write_back: bool = False) -> None:
        """Return parameters ``names`` to ``meta``; with ``write_back`` rank 0 first copies them to its home."""
        for name in names:
            current = self._current(name)
            if write_back and self.ctx.is_main and not current.is_meta:
                home = self.home[name]
                if current.data_ptr() != home.data_ptr():
                    home.copy_(current.detach())
            self._place(name, self._meta[name])

    @contextmanager
    def onloaded(self, names: list[str], write_back: bool = False) -> Iterator[None]:
        """Parameters ``names`` on the device for the duration of the block (see :meth:`onload`)."""
        self.onload(names)
        try:
            yield
        finally:
            self.offload(names, write_back=write_back)

    def restore(self, everywhere: bool = False) -> nn.Module:
        """Put rank 0's home back into the module (no copy); with ``everywhere`` other ranks receive a host copy."""
        for name, meta in self._meta.items():
            if self.ctx.is_main:
                tensor = self.home[name]
            elif everywhere:  # rank 0's tensor, received through this rank's device, kept on the CPU
                received = torch.empty(meta.shape, dtype=meta.dtype, device=self.ctx.device)
                tensor = self.ctx.broadcast_(received, src=0).cpu()
            else:
                continue
            if self.ctx.is_main and everywhere and self.ctx.distributed:
                self.ctx.broadcast_(tensor.to(self.ctx.device), src=0)
            self._place(name, nn.Parameter(tensor, requires_grad=self._grad[name]))
        return self.model
