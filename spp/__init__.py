"""spp: sparsity-preserved parameter-efficient fine-tuning of pruned LLMs (SPP, ICML 2024)."""

from spp.version import __version__

__all__ = ["__version__"]
