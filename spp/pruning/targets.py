"""Finding the decoder blocks and the linear layers to prune, and reading a model's current zero pattern (defined in
:mod:`spp.projections`, beside the other walkers over a model's projections)."""

from __future__ import annotations

from spp.projections import block_linears, current_masks, decoder_layers

__all__ = ["block_linears", "current_masks", "decoder_layers"]
