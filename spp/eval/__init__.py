"""Evaluation: WikiText-2 / C4 perplexity, lm-eval zero-shot and MMLU on local data, paper-shaped tables."""

from spp.eval.config import EvalConfig
from spp.eval.harness import HarnessResult, evaluate_tasks, run_eval_tasks
from spp.eval.perplexity import PerplexityResult, perplexity

__all__ = ["EvalConfig", "HarnessResult", "PerplexityResult", "evaluate_tasks", "perplexity", "run_eval_tasks"]
