"""Token-level perplexity over non-overlapping windows (the WikiText-2 protocol of SparseGPT / Wanda / SPP).

Protocol (DESIGN.md §3): the raw WikiText-2 *test* rows are joined with ``"\\n\\n"`` and tokenized once; the
token stream is cut into non-overlapping windows of ``seqlen`` tokens, the tail shorter than ``seqlen`` is
dropped, and ``PPL = exp(mean next-token NLL)`` over every predicted token of every window. All windows have
the same length, so this equals Wanda's ``exp(sum_w loss_w * seqlen / (n * seqlen))``. This is *not*
lm-eval's ``wikitext`` task (document-level rolling word perplexity); never compare the two.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from spp.paths import find_data

WIKITEXT2_TEST = "wikitext2/test.json"
C4_SAMPLE = "c4/c4_sample.jsonl"
C4_MAX_DOCS = 1100
C4_MAX_WINDOWS = 256
HUB_WIKITEXT2 = "hf:wikitext2"
SOURCES = ("wikitext2", "c4", HUB_WIKITEXT2)


@dataclass
class PerplexityResult:
    """Result of :func:`perplexity`.

    Attributes:
        ppl: ``exp(nll_mean)``.
        nll_mean: Mean next-token negative log-likelihood (nats) over all scored tokens.
        seqlen: Window length in tokens.
        windows: Number of windows evaluated.
        tokens: Number of scored (predicted) tokens, ``windows * (seqlen - 1)``.
        source: What was evaluated (``wikitext2``, ``c4`` or a file path).
    """

    ppl: float
    nll_mean: float
    seqlen: int
    windows: int
    tokens: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-serialisable)."""
        return asdict(self)


def _read_rows(path: Path) -> list[str]:
    """Read the ``text`` field of every line of a JSON-lines file, or the elements of a JSON array."""
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and raw.lstrip().startswith("["):
        records = json.loads(raw)
    else:
        records = [json.loads(line) for line in raw.splitlines() if line.strip()]
    try:
        return [str(r["text"]) for r in records]
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: every record needs a 'text' field (JSON lines of {{\"text\": ...}})") from err


def source_file(source: str, data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The local file a perplexity source reads (``None`` for the hub source ``hf:wikitext2``).

    Raises:
        FileNotFoundError: the local file is missing (names the key and the searched paths).
        ValueError: an unknown source.
    """
    if source == HUB_WIKITEXT2:
        return None
    if source == "wikitext2":
        return find_data(WIKITEXT2_TEST, data_dir)
    if source == "c4":
        return find_data(C4_SAMPLE, data_dir)
    path = Path(source).expanduser()
    if path.suffix not in {".json", ".jsonl", ".txt"}:
        raise ValueError(f"unknown perplexity source {source!r} (eval.ppl_source): use one of {', '.join(SOURCES)} "
                         "or a .json/.jsonl/.txt path")
    if not path.is_file():
        raise FileNotFoundError(f"eval.ppl_source={source!r} does not exist")
    return path


def load_eval_text(source: str = "wikitext2", data_dir: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """Return ``(text, label)`` for a perplexity source.

    Args:
        source: ``"wikitext2"`` (local raw test split, rows joined by ``"\\n\\n"``), ``"c4"`` (the local
            C4 sample: the first 1,000 documents of C4 *train* shard 0, not the validation shard SparseGPT
            uses; first 1,100 documents joined by ``" "`` as in SparseGPT's ``get_c4``), ``"hf:wikitext2"``
            (the hub dataset; needs network), or a path to a ``.json``/``.jsonl`` file of ``{"text": ...}``
            rows (joined by ``"\\n\\n"``) or a plain ``.txt`` file.
        data_dir: Data root override (config key ``data_dir``).

    Raises:
        FileNotFoundError: the local file is missing (names the searched paths).
        ValueError: an unknown source.
    """
    if source == HUB_WIKITEXT2:
        from datasets import load_dataset  # heavy optional path (network); only for the hub source

        rows = load_dataset("wikitext", "wikitext-2-raw-v1", split="test")["text"]
        return "\n\n".join(rows), "wikitext2"
    path = source_file(source, data_dir)
    if source == "wikitext2":
        return "\n\n".join(_read_rows(path)), "wikitext2"
    if source == "c4":
        return " ".join(_read_rows(path)[:C4_MAX_DOCS]), "c4-train00000-sample"
    if path.suffix == ".txt":
        return path.read_text(encoding="utf-8"), str(path)
    return "\n\n".join(_read_rows(path)), str(path)


def check_seqlen(seqlen: int, max_positions: int | None) -> None:
    """Raise a clear error when ``seqlen`` exceeds the model's context (``max_position_embeddings``)."""
    if seqlen < 2:
        raise ValueError(f"eval.seqlen={seqlen} must be at least 2 (one token of context, one to predict)")
    if max_positions is not None and seqlen > max_positions:
        raise ValueError(
            f"eval.seqlen={seqlen} exceeds the model's max_position_embeddings={max_positions}; "
            f"set eval.seqlen<={max_positions}"
        )


def tokenize_windows(text: str, tokenizer: Any, seqlen: int, max_windows: int | None = None) -> torch.Tensor:
    """Tokenize ``text`` once and cut it into non-overlapping ``seqlen`` windows, tail dropped.

    Returns:
        Long tensor of shape ``(windows, seqlen)``.

    Raises:
        ValueError: the text holds fewer than ``seqlen`` tokens.
    """
    ids = tokenizer(text, return_tensors="pt", verbose=False).input_ids[0]
    n = ids.numel() // seqlen
    if max_windows is not None:
        n = min(n, int(max_windows))
    if n < 1:
        raise ValueError(f"the text has {ids.numel()} tokens, fewer than one window of seqlen={seqlen}")
    return ids[: n * seqlen].view(n, seqlen)


@torch.no_grad()
def window_nll_sum(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """Sum of next-token NLL (fp32) of each window in a batch ``(b, seqlen)`` -> ``(b,)``."""
    logits = model(input_ids=windows, use_cache=False).logits.float()
    shift_logits = logits[:, :-1].reshape(-1, logits.size(-1))
    shift_labels = windows[:, 1:].reshape(-1)
    nll = F.cross_entropy(shift_logits, shift_labels, reduction="none")
    return nll.view(windows.size(0), -1).sum(dim=1)


def perplexity(
    model: torch.nn.Module,
    tokenizer: Any,
    source: str = "wikitext2",
    seqlen: int = 2048,
    max_windows: int | None = None,
    batch_size: int = 1,
    data_dir: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
) -> PerplexityResult:
    """Perplexity of ``model`` on non-overlapping ``seqlen``-token windows of ``source``.

    ``PPL = exp( (1 / (W (L-1))) * sum_w sum_{t=1}^{L-1} -log p(x_{w,t} | x_{w,<t}) )`` with ``W`` windows
    of ``L = seqlen`` tokens.

    Args:
        model: A causal LM returning ``.logits`` (HF ``*ForCausalLM``, pruned, SPP-wrapped or merged).
        tokenizer: Its tokenizer (called once on the whole text, with its default special tokens).
        source: See :func:`load_eval_text` (``wikitext2``, ``c4``, ``hf:wikitext2`` or a file path).
        seqlen: Window length; must not exceed ``model.config.max_position_embeddings``.
        max_windows: Evaluate only the first ``max_windows`` windows (quick runs); ``None`` = all (for
            ``c4``: the first 256, as in SparseGPT).
        batch_size: Windows per forward pass.
        data_dir: Data root override (config key ``data_dir``).
        device: Where to run; defaults to the device of the model's first parameter.

    Raises:
        ValueError: ``seqlen`` longer than the model's context, ``batch_size`` < 1, an unknown source.
    """
    config = getattr(model, "config", None)
    check_seqlen(seqlen, getattr(config, "max_position_embeddings", None))
    if batch_size < 1:
        raise ValueError(f"eval.batch_size={batch_size} must be >= 1")
    if max_windows is not None and max_windows < 1:
        raise ValueError(f"eval.max_windows={max_windows} must be >= 1 or null (all windows)")
    text, label = load_eval_text(source, data_dir)
    if source == "c4" and max_windows is None:
        max_windows = C4_MAX_WINDOWS  # SparseGPT's C4 protocol: the first 256 windows
    windows = tokenize_windows(text, tokenizer, seqlen, max_windows)
    if device is None:
        device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64)
    try:
        for start in tqdm(range(0, windows.size(0), batch_size), desc=f"ppl {label}@{seqlen}", unit="batch"):
            batch = windows[start : start + batch_size].to(device)
            total += window_nll_sum(model, batch).double().sum().cpu()
    finally:
        model.train(was_training)
    n_windows = windows.size(0)
    tokens = n_windows * (seqlen - 1)
    nll_mean = float(total) / tokens
    return PerplexityResult(
        ppl=math.exp(nll_mean), nll_mean=nll_mean, seqlen=seqlen, windows=n_windows, tokens=tokens, source=label
    )
