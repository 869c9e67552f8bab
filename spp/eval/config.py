"""Structured config of the ``eval`` group (``conf/eval/*.yaml``), shared by ``train.py`` and ``eval.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

from spp.eval.harness import resolve_tasks
from spp.job_base import Validated


@dataclass
class EvalConfig(Validated):
    """What to evaluate and how (docs/design.md §3).

    Attributes:
        name: Preset name (``default``, ``quick``, ``paper``, ``none``).
        ppl: Measure perplexity.
        ppl_source: Main perplexity source: ``wikitext2`` (local raw test split), ``wikitext2_val`` (local raw
            validation split: what ``sweep_objective=ppl_val_merged`` selects on), ``c4`` (local sample of C4
            train shard 0, *not* the validation shard), ``hf:wikitext2`` (hub) or a file path.
        extra_ppl_sources: Further sources measured with the same settings (e.g. ``[c4]``, ``[wikitext2_val]``) by
            ``eval.py`` and by ``train.py`` on the merged model (``summary.json`` → ``merged_ppl_by_source``; the
            dense and pruned models are measured on ``ppl_source`` only).
        seqlen: Perplexity window in tokens (2048 for LLaMA-1; 4096 for LLaMA-2); must not exceed the
            model's ``max_position_embeddings``.
        max_windows: Evaluate ``max_windows`` windows chosen by ``window_sampling``; null = all.
        window_sampling: ``first`` = the first ``max_windows`` windows (one article
            of WikiText-2); ``systematic`` = every ``k``-th window, ``k = n // max_windows`` of the split's ``n``
            windows, so the sample spans the split (stated in the result as ``sampling``/``stride``).
        batch_size: Perplexity windows per forward pass.
        tasks: lm-eval tasks or groups: ``spp_zeroshot`` (the paper's 7 tasks), ``spp_mmlu`` (5-shot),
            single tasks (``spp_boolq`` or the short ``boolq``); empty = none.
        limit: ``limit`` documents of every task (quick runs): a seeded random sample (``doc_seed``); null = all.
        mmlu_limit: ``mmlu_limit`` documents of every MMLU subject, sampled the same way; null = ``limit``.
        doc_seed: Seed of the random document sample that ``limit``/``mmlu_limit`` take from every local task
            (the one-epoch methods study); null = the first ``limit`` documents of each file.
        lm_eval_batch_size: lm-eval batch size.
        online: Use lm-eval's standard hub tasks instead of the local copies.
        device: Where to evaluate; null = where the model is (``eval.py``: cuda when available).
        gpus_per_replica: GPUs one evaluation replica spreads the model over (lm-eval ``parallelize=True``);
            the job's processes form replicas that split the perplexity windows and lm-eval documents. null = the
            fewest that hold the model (1 for 7B and 13B in bf16 on 80 GB GPUs, 2 for 70B); 1 on CPUs.
        max_memory_per_gpu: Weights per GPU of a replica spread over several (accelerate ``max_memory``, e.g.
            ``70GiB``); null = their free memory.
        log_samples: Keep lm-eval's per-document results (its ``log_samples``) and write them, one JSON line per
            scored document (task, doc id and hash, gold, per-choice log-likelihoods, ``acc``/``acc_norm``), to
            ``zero_shot_docs.jsonl`` beside ``results.json`` / ``summary.json``, with the majority-class accuracy
            of the scored documents; ``python -m spp.eval.paired`` compares two such files.
    """

    name: str = "default"
    ppl: bool = True
    ppl_source: str = "wikitext2"
    extra_ppl_sources: list[str] = field(default_factory=list)
    seqlen: int = 2048
    max_windows: int | None = None
    window_sampling: str = "first"
    batch_size: int = 1
    tasks: list[str] = field(default_factory=list)
    limit: int | None = None
    mmlu_limit: int | None = None
    doc_seed: int | None = 0
    lm_eval_batch_size: int = 1
    online: bool = False
    device: str | None = None
    gpus_per_replica: int | None = None
    max_memory_per_gpu: str | None = None
    log_samples: bool = False

    def validate(self) -> EvalConfig:
        """Raise ``ValueError`` naming the key when a setting is out of range or a task is unknown."""
        if self.seqlen < 2:
            raise ValueError(f"eval.seqlen={self.seqlen} must be >= 2")
        if self.max_windows is not None and self.max_windows < 1:
            raise ValueError(f"eval.max_windows={self.max_windows} must be >= 1 or null")
        if self.window_sampling not in ("first", "systematic"):
            raise ValueError(f"eval.window_sampling={self.window_sampling!r} must be 'first' or 'systematic'")
        if self.batch_size < 1 or self.lm_eval_batch_size < 1:
            raise ValueError("eval.batch_size and eval.lm_eval_batch_size must be >= 1")
        for key in ("limit", "mmlu_limit"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"eval.{key}={value} must be >= 1 or null (all documents)")
        if self.gpus_per_replica is not None and self.gpus_per_replica < 1:
            raise ValueError(f"eval.gpus_per_replica={self.gpus_per_replica} must be >= 1 or null (the fewest that "
                             "hold the model)")
        resolve_tasks(self.tasks)
        return self
