"""The plan counts the perplexity sources a job measures after training: ``eval.extra_ppl_sources`` add their
windows to the evaluate phase's time and their text to what a process tokenizes, and leave the phases before
training alone (those measure the main source only)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from spp.paths import CONF_DIR
from spp.planning.hardware import for_accelerator
from spp.planning.job import BPE_TOKENS_PER_CHAR, TEXT_CHARS, plan_job
from spp.preflight.model_files import model_arch
from spp.training.config import load_job, register_train_schema


def _plan(*overrides: str):
    register_train_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        job = load_job(compose("train", overrides=["model=llama2_7b", "eval=paper", *overrides]))
    return plan_job(job, model_arch(job.model), "gpu", "hub", devices=8, nodes=1)


@pytest.fixture(scope="module")
def plans():
    return _plan(), _plan("eval.extra_ppl_sources=[]")


def test_extra_sources_add_their_windows_and_text_to_the_evaluate_phase(plans):
    with_c4, alone = plans
    c4, wikitext = (int(TEXT_CHARS[s] * BPE_TOKENS_PER_CHAR) for s in ("c4", "wikitext2"))
    ev = with_c4.spec.eval
    assert (ev.ppl_windows, ev.extra_ppl_windows, ev.extra_text_tokens) == (wikitext // 2048, c4 // 2048, c4)
    assert (alone.spec.eval.extra_ppl_windows, alone.spec.eval.extra_text_tokens) == (0, 0)  # negative control
    per_token = for_accelerator("gpu").tokenize_bytes_per_token
    assert with_c4.phase("evaluate").rank0["tokenize"] == c4 * per_token  # the larger text, tokenized in turn
    assert alone.phase("evaluate").rank0["tokenize"] == wikitext * per_token
    tokens = (ev.ppl_windows + ev.extra_ppl_windows) * ev.seqlen + ev.lm_eval_tokens
    alone_tokens = ev.ppl_windows * ev.seqlen + ev.lm_eval_tokens
    ratio = with_c4.phase("evaluate").seconds["forward"] / alone.phase("evaluate").seconds["forward"]
    assert ratio == pytest.approx(tokens / alone_tokens) and ratio > 1.03  # lm-eval dominates


def test_extra_sources_leave_the_phases_before_training_alone(plans):
    with_c4, alone = plans
    for name in ("load", "prune", "fit", "export"):
        assert with_c4.phase(name).to_dict() == alone.phase(name).to_dict(), name
