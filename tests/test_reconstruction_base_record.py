"""An adapter trained after block-wise reconstruction records the reconstruction, and ``eval.py adapter_dir=``
loads it only on the reconstructed base: the same zeros but other weights, so the zero fingerprint alone would
accept the plain pruned model and give another model with no error."""

from __future__ import annotations

import json
import math

import pytest
from test_eval_job import _compose
from train_helpers import tiny_job

from spp.adapters.registry import MARKER
from spp.adapters.trained_on import RECORD
from spp.errors import UserError
from spp.eval.runner import run_eval_job
from spp.pruning.cache import cache_key
from spp.pruning.reconstruction.cache import reconstruct_key

RECONSTRUCT = ["reconstruct=blockwise", "reconstruct.nsamples=3", "reconstruct.seqlen=32", "reconstruct.epochs=2",
               "reconstruct.lr=0.05"]


@pytest.fixture(scope="module")
def reconstructed_run(tmp_path_factory):
    """A tiny SPP run (2 steps) on a reconstructed base: its job, summary and adapter folder."""
    from train import run_job

    tmp = tmp_path_factory.mktemp("reconstructed_run")
    job = tiny_job(tmp, "trainer.max_steps=2", "eval.seqlen=64", "eval.max_windows=2", *RECONSTRUCT)
    summary = run_job(job)
    assert summary["status"] == "ok"
    return job, summary, tmp / "run" / "adapter"


def _eval(job, adapter, *overrides):
    return _compose(f"adapter_dir={adapter}", f"cache_dir={job.cache_dir}", "pruner=wanda", "sparsity=nm2_4",
                    "calibration=c4", f"calibration.nsamples={job.calibration.nsamples}",
                    f"calibration.seqlen={job.calibration.seqlen}", *overrides)


def test_the_record_holds_the_reconstruction_key(reconstructed_run):
    job, summary, adapter = reconstructed_run
    record = json.loads((adapter / MARKER).read_text())[RECORD]
    pkey, pdigest = cache_key(job.model, job.pruner, job.sparsity, job.calibration, job.data_dir)
    key, digest = reconstruct_key(pkey, pdigest, job.reconstruct, job.data_dir)
    assert record["reconstruction"]["cache_key"] == digest
    assert record["reconstruction"]["key"] == json.loads(json.dumps(key, default=str))
    blocks = summary["reconstruction"]["blocks"]
    assert len(blocks) == 2 and all(b["loss_end"] < b["loss_start"] for b in blocks)  # the blocks did move
    assert summary["perplexity"]["reconstructed"]["ppl"] != summary["perplexity"]["pruned"]["ppl"]


def test_eval_refuses_the_plain_pruned_base_and_a_changed_reconstruction(reconstructed_run, tmp_path):
    job, _, adapter = reconstructed_run
    with pytest.raises(UserError, match=r"reconstructed block by block when trained \(reconstruct=blockwise\), not "
                                        r"here") as err:
        run_eval_job(_eval(job, adapter), tmp_path / "plain")
    assert "reconstruct=blockwise" in err.value.fix and "reconstruct.lr=0.05" in err.value.fix
    with pytest.raises(UserError, match=r"reconstruct.lr=0.05 when trained, 0.1 here"):
        run_eval_job(_eval(job, adapter, *RECONSTRUCT, "reconstruct.lr=0.1"), tmp_path / "other")


def test_eval_on_the_reconstructed_base_gives_the_runs_merged_model(reconstructed_run, tmp_path):
    job, summary, adapter = reconstructed_run
    record = run_eval_job(_eval(job, adapter, *RECONSTRUCT), tmp_path / "same")
    merged = summary["perplexity"]["merged"]["ppl"]
    assert record.info["reconstruction"]["cache_hit"]  # the run's reconstruction, read from the cache
    assert math.isclose(record.ppl["wikitext2"]["ppl"], merged, rel_tol=1e-5), (record.ppl, merged)
