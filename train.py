"""Train SPP on a pruned model: ``python train.py model=llama13b pruner=sparsegpt sparsity=unstructured50``.

Composes ``conf/train.yaml`` (typed by :class:`spp.training.config.TrainJobConfig`), prunes in a Lightning setup
callback through the pruning cache, fine-tunes the adapter on Alpaca, merges, audits the zeros, evaluates and
exports the sparse model. ``python train.py -m adapter.r=4,8,16`` sweeps with one pruning.
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from spp.training.config import register_configs  # noqa: E402
from spp.training.pipeline import run_training  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Run one job; returns the merged model's perplexity (the sweep objective) when it was measured."""
    summary = run_training(cfg)
    merged = (summary.get("perplexity") or {}).get("merged")
    return merged["ppl"] if merged else None


if __name__ == "__main__":
    main()
