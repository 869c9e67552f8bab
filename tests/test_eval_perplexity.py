"""Perplexity equals an independent exp(summed token NLL) over the same windows; errors are clear."""

from __future__ import annotations

import json
import math

import pytest
import torch

from spp.eval.perplexity import load_eval_text, perplexity


def _independent_ppl(model, tok, text: str, seqlen: int, n_windows: int) -> tuple[float, int]:
    """exp(sum of -log p(next token)) / count, in float64, one window at a time with the model directly."""
    ids = tok(text, return_tensors="pt").input_ids[0]
    usable = ids.numel() // seqlen
    n = min(usable, n_windows)
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range(n):
            x = ids[w * seqlen : (w + 1) * seqlen].unsqueeze(0)
            logp = torch.log_softmax(model(x).logits.double(), dim=-1)[0]
            for t in range(seqlen - 1):
                total -= float(logp[t, x[0, t + 1]])
                count += 1
    return math.exp(total / count), n


def test_wikitext2_ppl_matches_independent_computation(tiny_model, tiny_tok, sample_data_dir):
    rows = [json.loads(line)["text"] for line in (sample_data_dir / "wikitext2/test.json").open()]
    text = "\n\n".join(rows)
    expected, n = _independent_ppl(tiny_model, tiny_tok, text, seqlen=64, n_windows=3)
    res = perplexity(tiny_model, tiny_tok, seqlen=64, max_windows=3, data_dir=sample_data_dir)
    assert res.windows == n == 3
    assert res.tokens == 3 * 63
    assert res.seqlen == 64 and res.source == "wikitext2"
    assert res.ppl == pytest.approx(expected, rel=1e-6)
    assert res.nll_mean == pytest.approx(math.log(expected), rel=1e-6)
    # random tiny model over a 260-token vocabulary: close to uniform, far from a trained model
    assert 150 < res.ppl < 400


def test_batching_and_tail_drop(tiny_model, tiny_tok, tmp_path):
    # 10 rows of 28 bytes joined by "\n\n" -> 10*28 + 9*2 = 298 byte tokens -> 4 windows of 64, tail 42 dropped
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i:02d} " + "abcdefghijklmnopqrstu"}) + "\n" for i in range(10)))
    assert len(tiny_tok(load_eval_text(str(path))[0]).input_ids) == 298
    one = perplexity(tiny_model, tiny_tok, source=str(path), seqlen=64, batch_size=1)
    many = perplexity(tiny_model, tiny_tok, source=str(path), seqlen=64, batch_size=3)
    assert one.windows == many.windows == 4
    assert many.ppl == pytest.approx(one.ppl, rel=1e-5)
    expected, _ = _independent_ppl(tiny_model, tiny_tok, load_eval_text(str(path))[0], 64, 100)
    assert one.ppl == pytest.approx(expected, rel=1e-6)
    assert one.to_dict()["windows"] == 4


def test_c4_sample_source(tiny_model, tiny_tok, sample_data_dir):
    res = perplexity(tiny_model, tiny_tok, source="c4", seqlen=32, max_windows=2, data_dir=sample_data_dir)
    assert res.source == "c4-train00000-sample" and res.windows == 2
    assert math.isfinite(res.ppl)


def test_seqlen_longer_than_context_is_rejected(tiny_model, tiny_tok):
    with pytest.raises(ValueError, match=r"eval.seqlen=1024 exceeds the model's max_position_embeddings=512"):
        perplexity(tiny_model, tiny_tok, seqlen=1024)


def test_unknown_source_and_missing_file(tiny_model, tiny_tok, tmp_path):
    with pytest.raises(ValueError, match="unknown perplexity source 'ptb'"):
        perplexity(tiny_model, tiny_tok, source="ptb", seqlen=32)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        perplexity(tiny_model, tiny_tok, source=str(tmp_path / "nope.jsonl"), seqlen=32)
