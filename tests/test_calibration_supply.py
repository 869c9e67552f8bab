"""What a calibration source can supply: document sampling needs ``nsamples`` documents longer than ``seqlen``
tokens, stream sampling a stream of ``nsamples * seqlen`` tokens; otherwise one line naming the key and the file,
from the preflight, before the model loads. Each draw logs and records how many distinct documents it used."""

from __future__ import annotations

import gzip
import json
import logging
import random

import pytest
import torch
import transformers
from test_errors import cli, one_line

import spp.models.tiny
from spp.errors import UserError
from spp.models.config import ModelConfig
from spp.models.loading import load_tokenizer
from spp.models.tiny import tiny_llama
from spp.paths import SAMPLE_DATA_DIR
from spp.pruning import CalibrationConfig, PrunerConfig, SparsityConfig
from spp.pruning.cache import prune_cached
from spp.pruning.calibration_data import (
    check_calibration_source,
    check_supply,
    draw_calibration,
    load_texts,
    sample_windows,
)
from spp.pruning.engine import prune_model

C4 = SAMPLE_DATA_DIR / "c4/c4_sample.jsonl"
TINY = ModelConfig(name="tiny", path="tiny")


@pytest.fixture
def no_weights(monkeypatch):
    """Building or reading a model's weights fails the test (the refusals come first)."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("model weights were built or loaded before the refusal")

    monkeypatch.setattr(spp.models.tiny, "tiny_model", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def _jsonl(path, lengths: list[int]) -> str:
    """Documents of exactly ``lengths`` bytes (the tiny tokenizer: one token per byte, no special token)."""
    path.write_text("".join(json.dumps({"text": "ab" * (n // 2) + "c" * (n % 2)}) + "\n" for n in lengths))
    return str(path)


def test_shipped_c4_sample_holds_32_documents_for_2048_token_windows():
    """The paper's 128 x 2048 on the shipped sample (SmolLM2's tokenizer): refused, naming both keys and the file;
    the fix's numbers are what the sample can give."""
    tok = load_tokenizer(ModelConfig())
    texts = load_texts(C4)
    lengths = sorted((len(tok(t)["input_ids"]) for t in texts), reverse=True)
    assert sum(n > 2048 for n in lengths) == 32  # the independent count
    with pytest.raises(UserError) as err:
        check_supply(texts, tok, CalibrationConfig(nsamples=128, seqlen=2048), str(C4))
    line = str(err.value)
    assert err.value.key == "calibration.nsamples" and "\n" not in line
    assert "holds 32 of 1000" in line and "calibration.nsamples to <= 32" in line and str(C4) in line
    assert f"calibration.seqlen to <= {lengths[127] - 1}" in line
    check_supply(texts, tok, CalibrationConfig(nsamples=128, seqlen=lengths[127] - 1), str(C4))  # that one passes
    with pytest.raises(UserError):
        check_supply(texts, tok, CalibrationConfig(nsamples=128, seqlen=lengths[127]), str(C4))


@pytest.mark.parametrize("nsamples, refused", [(3, False), (4, True)])
def test_document_rule_boundary(tmp_path, tiny_tok, nsamples, refused):
    """Three documents longer than 100 tokens (101, 150, 400), one of exactly 100: 3 windows pass, 4 do not."""
    path = _jsonl(tmp_path / "docs.jsonl", [101, 100, 150, 20, 400])
    cal = CalibrationConfig(source=path, nsamples=nsamples, seqlen=100, sampling="document")
    if refused:
        with pytest.raises(UserError, match="holds 3 of 5"):
            draw_calibration(tiny_tok, cal)
    else:
        draw = draw_calibration(tiny_tok, cal)
        assert draw.windows.shape == (3, 100) and 1 <= draw.distinct_documents <= 3


def test_distinct_documents_match_the_reference_draw(tiny_tok, caplog):
    """The count recorded and logged is the number of distinct documents of the reference's draw sequence."""
    cal = CalibrationConfig(source="c4", nsamples=40, seqlen=2000, seed=0)
    texts = load_texts(C4)
    with caplog.at_level(logging.INFO, logger="spp.pruning.calibration_data"):
        draw = draw_calibration(tiny_tok, cal, SAMPLE_DATA_DIR)
    random.seed(0)  # Wanda/SparseGPT get_c4, independently
    docs = []
    for _ in range(40):
        while True:
            doc = random.randint(0, len(texts) - 1)
            ids = tiny_tok(texts[doc])["input_ids"]
            if len(ids) > 2000:
                break
        random.randint(0, len(ids) - 2000 - 1)
        docs.append(doc)
    assert draw.distinct_documents == len(set(docs)) < 40  # repeats happen at this length
    assert draw.record()["distinct_documents"] == len(set(docs)) and draw.record()["texts_in_file"] == 1000
    assert f"40 windows of 2000 tokens from {len(set(docs))} distinct documents of 1000" in caplog.text


def test_stream_refusals_and_coverage(tmp_path, tiny_tok):
    short = tmp_path / "short.txt"
    short.write_text("x" * 50)
    with pytest.raises(UserError, match="not more than calibration.seqlen=64") as err:
        draw_calibration(tiny_tok, CalibrationConfig(source=str(short), nsamples=1, seqlen=64))
    assert err.value.key == "calibration.seqlen"
    text = tmp_path / "text.txt"
    text.write_text("y" * 1000)
    with pytest.raises(UserError, match="calibration.nsamples to <= 15") as err:  # 1000 // 64
        draw_calibration(tiny_tok, CalibrationConfig(source=str(text), nsamples=16, seqlen=64))
    assert err.value.key == "calibration.nsamples"
    draw = sample_windows(["y" * 1000], tiny_tok, CalibrationConfig(source=str(text), nsamples=15, seqlen=64))
    rng, covered = random.Random(0), set()
    for _ in range(15):
        start = rng.randint(0, 1000 - 64 - 1)
        covered.update(range(start, start + 64))
    assert (draw.stream_tokens, draw.covered_tokens, draw.distinct_documents) == (1000, len(covered), None)


def test_gzip_file_gives_the_same_windows(tmp_path, tiny_tok):
    packed = tmp_path / "c4-train.00000-of-01024.json.gz"
    packed.write_bytes(gzip.compress(C4.read_bytes()))
    cal = dict(nsamples=6, seqlen=300, sampling="document")
    plain = draw_calibration(tiny_tok, CalibrationConfig(source="c4", **cal), SAMPLE_DATA_DIR)
    gz = draw_calibration(tiny_tok, CalibrationConfig(source="c4", path=str(packed), **cal))
    assert torch.equal(plain.windows, gz.windows)


@pytest.mark.parametrize("cmd", ["prune", "train", "eval"])
@pytest.mark.parametrize("args, key, words", [
    (["calibration.nsamples=100000", "calibration.seqlen=128"], "calibration.nsamples", ["100000", "c4_sample"]),
    (["calibration.seqlen=500"], "calibration.seqlen", ["short.txt", "calibration.seqlen"]),
])
def test_commands_refuse_before_loading(cmd, args, key, words, tmp_path, monkeypatch, capsys, no_weights):
    short = tmp_path / "short.txt"
    short.write_text("z" * 200)
    source = [f"calibration.source={short}"] if key == "calibration.seqlen" else []
    extra = {"train": ["debug=fast"], "eval": ["eval.seqlen=128", "eval.tasks=[]"]}.get(cmd, [])
    code, err, _ = cli(cmd, ["model=tiny", "pruner=wanda", "sparsity=nm2_4", f"data_dir={SAMPLE_DATA_DIR}", *extra,
                             *source, *args], tmp_path, monkeypatch, capsys)
    assert code == 2
    one_line(err, cmd, key, *words)


def test_preflight_check_needs_no_weights(tmp_path, no_weights):
    path = _jsonl(tmp_path / "docs.jsonl", [300, 300])
    check_calibration_source(CalibrationConfig(source=path, nsamples=2, seqlen=256, sampling="document"), None,
                             TINY)
    with pytest.raises(UserError, match="holds 2 of 2"):
        check_calibration_source(CalibrationConfig(source=path, nsamples=3, seqlen=256, sampling="document"), None,
                                 TINY)


def test_prune_result_records_the_draw_also_on_a_cache_hit(tmp_path, tiny_tok):
    from spp.distributed import DistContext
    from spp.models.offload import OffloadedModel

    pruner, sparsity = PrunerConfig(name="wanda"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
    cal = CalibrationConfig(nsamples=4, seqlen=300)
    result = prune_model(tiny_llama(seed=0), tiny_tok, pruner, sparsity, cal, SAMPLE_DATA_DIR, device="cpu")
    want = draw_calibration(tiny_tok, cal, SAMPLE_DATA_DIR, announce=False).record()
    assert result.report.overall["calibration"] == want
    for hit in (False, True):
        off = OffloadedModel(tiny_llama(seed=0), DistContext(device=torch.device("cpu")))
        got = prune_cached(off, tiny_tok, TINY, pruner, sparsity, cal, tmp_path / "cache", SAMPLE_DATA_DIR)
        off.restore()
        assert got.cache_hit is hit and got.report.overall["calibration"] == want
