"""eval.py's typed config, the evaluation job on a tiny model (plain, pruned, with an adapter), bad inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from spp.errors import UserError
from spp.eval.job_config import register_eval_schema
from spp.eval.perplexity import perplexity
from spp.eval.runner import preflight, run_eval_job
from spp.paths import CONF_DIR, REPO_ROOT, SAMPLE_DATA_DIR

TINY = ["model=tiny", "eval.seqlen=64", "eval.max_windows=2", f"data_dir={SAMPLE_DATA_DIR}", "print_config=false"]


def _compose(*overrides: str):
    """The typed job, converted once as ``eval.py`` does."""
    register_eval_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="evaluate", overrides=[*TINY, *overrides]))


def test_config_is_typed():
    cfg = _compose()
    assert cfg.eval.seqlen == 64 and cfg.pruner.name == "none" and cfg.sparsity.kind == "dense"
    with pytest.raises(ConfigCompositionException):
        _compose("eval.limt=3")
    with pytest.raises(ConfigCompositionException):
        _compose("eval.limit=abc")
    for preset in ("default", "quick", "paper", "none"):
        assert _compose(f"eval={preset}").eval.name == preset


def test_dense_job_writes_results_and_table(tmp_path):
    cfg = _compose("eval.tasks=[spp_rte,spp_arc_easy]", "eval.limit=2", f"run_dir={tmp_path}")
    record = run_eval_job(cfg, tmp_path)
    payload = json.loads((tmp_path / "results.json").read_text())
    (row,) = payload["records"]
    assert row["ppl"]["wikitext2"]["windows"] == 2 and row["ppl"]["wikitext2"]["seqlen"] == 64
    assert row["tasks"]["spp_rte"]["n"] == 2 and 0 <= row["tasks"]["spp_arc_easy"]["acc_norm"] <= 1
    assert row["zero_shot_mean_acc"] is None  # only 2 of the 7 tasks ran
    md = (tmp_path / "results.md").read_text()
    assert "| Model | wikitext2 PPL (64×2) | BoolQ | RTE | HellaSwag | WinoGrande | ARC-e | ARC-c | OBQA |" in md
    ppl = record.ppl["wikitext2"]  # with its 95 % bootstrap interval over windows (the one-epoch methods study)
    # ... and, from 2 windows, the caveat that such an interval is rough
    ppl_cell = f"{ppl['ppl']:.2f} [{ppl['ci_low']:.2f}, {ppl['ci_high']:.2f}] (2 windows: a rough interval)"
    assert f"| tiny | {ppl_cell} | – | {100 * row['tasks']['spp_rte']['acc']:.2f} |" in md
    metrics = (tmp_path / "csv" / "metrics.csv").read_text()
    assert "eval/ppl/wikitext2" in metrics and "eval/acc/spp_rte" in metrics
    assert record.info["linear_sparsity"] == 0.0


def test_pruned_job_goes_through_the_cache(tmp_path):
    overrides = ["pruner=wanda", "sparsity=nm2_4", "calibration=quick", "calibration.nsamples=4",
                 "calibration.seqlen=64", f"cache_dir={tmp_path / 'cache'}"]
    first = run_eval_job(_compose(*overrides), tmp_path / "a")
    second = run_eval_job(_compose(*overrides), tmp_path / "b")
    assert first.info["linear_sparsity"] == pytest.approx(0.5, abs=1e-12)  # 2:4 on every decoder linear
    assert first.info["cache_hit"] is False and second.info["cache_hit"] is True
    assert second.ppl["wikitext2"]["ppl"] == pytest.approx(first.ppl["wikitext2"]["ppl"], rel=1e-6)
    assert first.label == "tiny wanda nm2_4"


def test_adapter_dir_is_applied(tmp_path, tiny_tok):
    import spp
    from spp.models.tiny import tiny_llama

    model = tiny_llama(seed=0)
    spp.inject(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in spp.spp_layers(model).values():
            layer.spp_beta.copy_(torch.randn(layer.spp_beta.shape, generator=gen) * 0.5)
    spp.save_adapter(model, tmp_path / "adapter")
    expected = perplexity(model, tiny_tok, seqlen=64, max_windows=2, data_dir=SAMPLE_DATA_DIR).ppl
    plain = perplexity(tiny_llama(seed=0), tiny_tok, seqlen=64, max_windows=2, data_dir=SAMPLE_DATA_DIR).ppl
    adapted = run_eval_job(_compose(f"adapter_dir={tmp_path / 'adapter'}"), tmp_path / "adapted")
    assert adapted.ppl["wikitext2"]["ppl"] == pytest.approx(expected, rel=1e-5)
    assert abs(adapted.ppl["wikitext2"]["ppl"] - plain) > 1e-3
    assert adapted.label == "tiny +adapter"


@pytest.fixture()
def no_model_loading(monkeypatch):
    def _fail(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was reported")

    monkeypatch.setattr("spp.eval.runner.load_model", _fail)


@pytest.mark.usefixtures("no_model_loading")
def test_bad_inputs_fail_before_loading(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown eval task 'hellaswagg'"):
        run_eval_job(_compose("eval.tasks=[hellaswagg]"), tmp_path)
    with pytest.raises(ValueError, match="eval.seqlen=1024 exceeds the model's max_position_embeddings=512"):
        run_eval_job(_compose("eval.seqlen=1024"), tmp_path)
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="has no weights"):
        run_eval_job(_compose(f"model.path={tmp_path / 'noweights'}"), tmp_path)
    with pytest.raises(UserError, match="is not an adapter directory"):
        run_eval_job(_compose(f"adapter_dir={tmp_path}"), tmp_path)
    with pytest.raises(ValueError, match="sparsity=nm2_4 needs a pruner"):
        run_eval_job(_compose("sparsity=nm2_4"), tmp_path)
    with pytest.raises(FileNotFoundError, match="eval.ppl_source='/nonexistent.jsonl' does not exist"):
        run_eval_job(_compose("eval.ppl_source=/nonexistent.jsonl"), tmp_path)
    import spp.paths

    monkeypatch.setattr(spp.paths, "SAMPLE_DATA_DIR", tmp_path / "none")
    monkeypatch.setattr(spp.paths, "SHARED_DATA_DIR", tmp_path / "none")
    cfg = _compose("eval.tasks=[spp_winogrande]", f"data_dir={tmp_path}", "eval.ppl=false")
    with pytest.raises(FileNotFoundError, match="eval task spp_winogrande: data file 'winogrande/winogrande.jsonl'"):
        preflight(cfg)


def test_seqlen_is_checked_against_the_context_gpt2_calls_n_positions(tmp_path):
    """GPT-2's config names its context ``n_positions``: a tiny GPT-2 (built here or saved) of 64 positions refuses
    eval.seqlen=128 before any weight is read; 64 passes."""
    from spp.models.tiny import tiny_model, tiny_tokenizer

    gpt2 = ["+model.arch.model_type=gpt2", "+model.arch.n_positions=64"]
    with pytest.raises(ValueError, match="eval.seqlen=128 exceeds the model's max_position_embeddings=64"):
        preflight(_compose(*gpt2, "eval.seqlen=128"))
    preflight(_compose(*gpt2, "eval.seqlen=64"))
    tiny_model(model_type="gpt2", n_positions=64).save_pretrained(tmp_path / "gpt2")
    tiny_tokenizer().save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="eval.seqlen=128 exceeds the model's max_position_embeddings=64"):
        preflight(_compose(f"model.path={tmp_path / 'gpt2'}", "eval.seqlen=128"))


@pytest.mark.slow  # an eval.py process (21 s loaded); the checks themselves are tested in-process above; CI runs it
def test_eval_py_reports_one_error_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "eval.py", "model=tiny", "eval.seqlen=4096", "print_config=false", f"run_dir={tmp_path}"],
        cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 2  # spp.errors.EXIT_USER_ERROR
    assert proc.stderr.strip().splitlines() == [
        "eval.py: error: eval.seqlen=4096 exceeds the model's max_position_embeddings=512 — set eval.seqlen<=512"
    ]


def test_a_held_cache_lock_ends_after_the_jobs_cache_lock_timeout(tmp_path):
    import fcntl
    import time

    from spp.pruning.cache import cache_entry_dir, cache_key

    cfg = _compose("pruner=magnitude", "sparsity=unstructured50", f"cache_dir={tmp_path / 'cache'}",
                   "cache_lock_timeout_s=1")
    assert cfg.cache_lock_timeout_s == 1  # eval.py takes the key prune.py and train.py take
    entry = cache_entry_dir(cfg.cache_dir, *cache_key(cfg.model, cfg.pruner, cfg.sparsity, cfg.calibration,
                                                      cfg.data_dir))
    entry.parent.mkdir(parents=True)
    fd = os.open(f"{entry}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another job is writing this entry
    start = time.perf_counter()
    try:
        with pytest.raises(UserError, match="for more than 1 s") as err:
            run_eval_job(cfg, tmp_path / "out")
    finally:
        os.close(fd)
    assert err.value.key == "cache_lock_timeout_s" and time.perf_counter() - start < 60  # not the 7200 s default


def test_online_tasks_neither_need_nor_record_the_local_task_files(tmp_path, monkeypatch):
    from spp.eval.evaluate import Evaluation

    monkeypatch.setattr("spp.eval.runner.evaluate", lambda *args, **kwargs: Evaluation(  # lm-eval's hub tasks need
        zero_shot={"metrics": {"spp_rte": {"acc": 0.5}}, "num_fewshot": {}}))  # the network: its result stands in
    (tmp_path / "data").mkdir()  # a data root without the local copies of the tasks
    cfg = _compose("eval.tasks=[spp_rte]", "eval.online=true", "eval.ppl=false", f"data_dir={tmp_path / 'data'}")
    record = run_eval_job(cfg, tmp_path / "out")
    assert record.tasks == {"spp_rte": {"acc": 0.5}} and record.info["data_files"] == []
    offline = _compose("eval.tasks=[spp_rte]", "eval.ppl=false", f"data_dir={tmp_path / 'data'}")
    with pytest.raises(FileNotFoundError, match="eval task spp_rte"):  # the control: offline they are needed
        run_eval_job(offline, tmp_path / "offline")


def test_each_job_of_a_process_records_only_its_own_data_files(tmp_path):
    files = []
    for source in ("wikitext2", "c4"):  # eval.py -m eval.ppl_source=wikitext2,c4 runs both jobs in one process
        record = run_eval_job(_compose(f"eval.ppl_source={source}"), tmp_path / source)
        files.append({row["path"] for row in record.info["data_files"]})
    assert files == [{"data/wikitext2/test.json"}, {"data/c4/c4_sample.jsonl"}]


@pytest.mark.parametrize(("arch", "limit"), [({"model_type": "gpt2", "n_positions": 64}, 64),
                                             ({"model_type": "llama", "max_position_embeddings": 64}, 64),
                                             ({"model_type": "llama"}, None)])
def test_a_hub_models_context_is_read_under_its_familys_name(arch, limit):
    """A hub id's ``model.arch`` read as its family's config reads it: GPT-2's ``n_positions=64`` refuses
    eval.seqlen=128 in one line before any download; LLaMA's ``max_position_embeddings`` is the control, and an arch
    naming no context gets no check (never the family's default)."""
    from spp.eval.runner import context_length
    from spp.models.config import ModelConfig

    cfg = _compose("model.path=openai-community/gpt2", "eval.seqlen=128")
    cfg.model = ModelConfig(name="hub", path="openai-community/gpt2", arch=arch)
    assert context_length(cfg.model) == limit
    if limit is None:
        return
    with pytest.raises(ValueError, match=r"^eval.seqlen=128 exceeds the model's max_position_embeddings=64; set "
                                         r"eval.seqlen<=64$"):
        preflight(cfg)
