"""Pruning masks kept one bit per weight, off the accelerator, and the zero pattern they imply.
:class:`ZeroPattern` also stores the few kept weights that are exactly zero (a quantised checkpoint has some)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from spp.bitmask import pack_rows, unpack_rows


class MaskSet(Mapping[str, torch.Tensor]):
    """Keep-masks (True = kept) by qualified linear name, stored packed on the CPU; ``masks[name]`` unpacks one."""

    def __init__(self, masks: Mapping[str, torch.Tensor] | None = None) -> None:
        self._packed: dict[str, torch.Tensor] = {}
        self._cols: dict[str, int] = {}
        for name, mask in (masks or {}).items():
            self.set(name, mask)

    def set(self, name: str, mask: torch.Tensor) -> None:
        """Store ``mask`` (bool, out x in, any device) for ``name``."""
        if mask.dim() != 2:
            raise ValueError(f"mask for {name} must be 2-D (out x in), got shape {tuple(mask.shape)}")
        self._packed[name] = pack_rows(mask.to(torch.bool)).cpu()
        self._cols[name] = int(mask.shape[1])

    def packed(self, name: str) -> torch.Tensor:
        """The row-packed mask of ``name``."""
        return self._packed[name]

    def shape(self, name: str) -> tuple[int, int]:
        """``(out, in)`` of ``name``'s mask."""
        return int(self._packed[name].shape[0]), self._cols[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        return unpack_rows(self._packed[name], self._cols[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._packed)

    def __len__(self) -> int:
        return len(self._packed)


class ZeroPattern(Mapping[str, torch.Tensor]):
    """The exact-zero pattern (True = zero) of pruned weights: every pruned position plus the kept zeros."""

    def __init__(self, masks: MaskSet, kept_zeros: Mapping[str, torch.Tensor] | None = None) -> None:
        self.masks = masks
        self.kept_zeros = {k: v.cpu() for k, v in (kept_zeros or {}).items() if v.numel()}

    def __getitem__(self, name: str) -> torch.Tensor:
        zero = ~self.masks[name]
        extra = self.kept_zeros.get(name)
        if extra is not None:
            zero.view(-1)[extra] = True
        return zero

    def __iter__(self) -> Iterator[str]:
        return iter(self.masks)

    def __len__(self) -> int:
        return len(self.masks)


def kept_zero_indices(name: str, mask: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Flat indices (int64, CPU) of kept weights that are exactly zero; a non-zero pruned weight raises."""
    w = weight.detach()
    mask = mask.to(w.device)
    if bool((w[~mask] != 0).any()):
        raise RuntimeError(f"{name}: a weight pruned by its mask is non-zero; the mask was not applied")
    return torch.nonzero((w == 0).view(-1) & mask.view(-1)).view(-1).cpu()
