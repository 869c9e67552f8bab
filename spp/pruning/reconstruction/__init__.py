"""Block-wise reconstruction of a pruned model against its dense model (``reconstruct=blockwise``).

``config`` (the options), ``loss`` (per-window losses), ``one_block`` (an adapter method on one block),
``train_block`` (one block's training on N ranks), ``engine`` (the block-by-block pass), ``cache`` (entries beside
the pruning cache's), ``phase`` (the phase ``prune.py`` and ``train.py`` run after pruning).
"""
