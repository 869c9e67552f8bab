"""Calibration windows: the reference C4 sampling procedure, stream sampling, file formats."""

from __future__ import annotations

import random

import pytest

from spp.paths import SAMPLE_DATA_DIR
from spp.pruning import CalibrationConfig
from spp.pruning.calibration_data import draw_calibration, load_texts, resolve_calibration_file


def test_c4_windows_follow_the_reference_sampler(tiny_tok) -> None:
    cal = CalibrationConfig(source="c4", nsamples=5, seqlen=300, seed=0)
    windows = draw_calibration(tiny_tok, cal, SAMPLE_DATA_DIR).windows
    assert windows.shape == (5, 300)
    docs = load_texts(SAMPLE_DATA_DIR / "c4/c4_sample.jsonl")
    random.seed(0)  # Wanda/SparseGPT get_c4: redraw documents until one is longer than seqlen, then a window
    for row in windows.tolist():
        while True:
            ids = tiny_tok(docs[random.randint(0, len(docs) - 1)])["input_ids"]
            if len(ids) > 300:
                break
        start = random.randint(0, len(ids) - 300 - 1)
        assert row == ids[start : start + 300]
    other_seed = draw_calibration(tiny_tok, CalibrationConfig(nsamples=5, seqlen=300, seed=1), SAMPLE_DATA_DIR).windows
    assert not (other_seed == windows).all()


def test_alpaca_stream_windows_come_from_the_joined_records(tiny_tok) -> None:
    cal = CalibrationConfig(source="alpaca", nsamples=3, seqlen=128)
    windows = draw_calibration(tiny_tok, cal, SAMPLE_DATA_DIR).windows
    texts = load_texts(resolve_calibration_file(cal, SAMPLE_DATA_DIR))
    assert len(texts) == 1551 and "\n\n" in texts[0]
    stream = tiny_tok("\n\n".join(texts))["input_ids"]
    rng = random.Random(0)
    for row in windows.tolist():
        start = rng.randint(0, len(stream) - 128 - 1)
        assert row == stream[start : start + 128]


def test_wikitext_rows_are_json_lines_and_a_missing_file_names_the_fix(tiny_tok, tmp_path) -> None:
    assert len(load_texts(SAMPLE_DATA_DIR / "wikitext2/test.json")) == 4358
    with pytest.raises(FileNotFoundError, match="calibration.path / data_dir"):
        resolve_calibration_file(CalibrationConfig(source="c4", path="c4/missing.jsonl"), SAMPLE_DATA_DIR)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text field here"}\n')
    with pytest.raises(ValueError, match="calibration.text_field"):
        load_texts(bad)
