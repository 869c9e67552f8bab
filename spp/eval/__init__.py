"""Evaluation: WikiText-2 / C4 perplexity, lm-eval zero-shot and MMLU on local data, paper-shaped tables."""

from spp.eval.perplexity import PerplexityResult, perplexity

__all__ = ["PerplexityResult", "perplexity"]
