"""W&B for real, offline: a tiny ``train.py`` job with ``logger=[csv,wandb]`` and ``eval.py`` on its merged folder,
each W&B run read back from the binary ``.wandb`` file of its offline run folder (what ``wandb sync`` uploads).

wandb 0.31 keeps an offline run's config, history, summary and artifact manifests only inside that file: a
LevelDB-style log of ``wandb_internal_pb2.Record`` protobufs (7-byte header, 32 KiB blocks, each chunk with a
checksum, a length and a FULL / FIRST / MIDDLE / LAST type). :func:`read_offline_run` decodes it with wandb's own
protobuf classes (wandb 0.31 ships no Python reader of the file).
"""

from __future__ import annotations

import json
import math
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from train_helpers import tiny_job

from spp.eval.job_config import register_eval_schema
from spp.eval.runner import run_eval_job
from spp.paths import CONF_DIR, SAMPLE_DATA_DIR
from spp.training.callbacks.recovery_curve import CURVE_METRIC
from spp.training.run import pruning_identity
from train import run_job

HEADER = b":W&B\xe1\xbe\x00"  # ident, magic, version
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """What one offline W&B run recorded."""

    name: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    artifacts: list[dict[str, Any]] = field(default_factory=list)


def _records(path: Path) -> list[Any]:
    """Every ``Record`` of a ``.wandb`` file, in order (chunks joined by their type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[: len(HEADER)] == HEADER, f"{path} is not a W&B transaction log"
    records, pos, pending = [], len(HEADER), b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_offline_run(run_dir: Path) -> OfflineRun:
    """The one offline W&B run under ``<run_dir>/wandb``: name, tags, config (nested), history rows, final summary
    and artifacts (name, type, metadata, manifest paths)."""
    (path,) = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    records = _records(path)
    deadline = time.monotonic() + 60
    while not any(r.WhichOneof("record_type") == "exit" for r in records):  # wandb-core may still be flushing
        assert time.monotonic() < deadline, f"{path} has no exit record: the W&B run was not finished"
        time.sleep(0.2)
        records = _records(path)
    out = OfflineRun()
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out.name, out.tags = record.run.display_name, list(record.run.tags)
            out.config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            out.config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            out.history.append({_item_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            out.summary.update({_item_key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "artifact":
            art = record.artifact
            out.artifacts.append({"name": art.name, "type": art.type, "metadata": json.loads(art.metadata or "{}"),
                                  "paths": sorted(e.path for e in art.manifest.contents)})
    return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"adapter": {"r": 16}}`` → ``{"adapter.r": 16}``: the columns W&B's runs table shows."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.fixture(scope="module")
def wandb_offline(tmp_path_factory):
    """W&B offline, its config / cache / staging folders in a temporary directory."""
    tmp = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("WANDB_API_KEY", raising=False)
        mp.setenv("WANDB_MODE", "offline")
        for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            mp.setenv(var, str(tmp / var.lower()))
        yield tmp


@pytest.fixture(scope="module")
def wandb_run(wandb_offline, tmp_path_factory):
    """A tiny SPP job (16 steps, one validation, the recovery curve every 8 steps) logging to CSV and W&B, merged
    model uploaded too."""
    tmp = tmp_path_factory.mktemp("train-wandb")
    job = tiny_job(tmp, "trainer.max_steps=16", "data.max_examples=68", "logger=[csv,wandb]",
                   "logger.wandb.log_model=true", "trainer.curve_every_n_steps=8")
    summary = run_job(job)
    return tmp, job, summary, read_offline_run(tmp / "run")


def test_config_columns_hold_the_resolved_job_and_the_pruned_base(wandb_run):
    _, job, summary, run = wandb_run
    assert run.name == summary["run"]["name"] and set(run.tags) == set(summary["run"]["tags"])
    columns = flatten(run.config)
    assert columns["adapter.r"] == job.adapter.r == 16
    assert columns["trainer.lr"] == pytest.approx(job.trainer.lr)
    assert (columns["pruner.name"], columns["sparsity.name"]) == ("wanda", "nm2_4")
    assert columns["model.name"] == "tiny" and columns["trainer.max_steps"] == 16
    digest = pruning_identity(job).digest
    assert digest and columns["identity.pruning_cache_key"] == digest
    assert "adapter.r" not in run.config  # nested, as Lightning's WandbLogger logs it; W&B shows the dotted column


def test_metrics_over_steps_and_the_final_table(wandb_run):
    tmp, _, summary, run = wandb_run
    losses = [row["train/loss"] for row in run.history if "train/loss" in row]
    assert len(losses) == 16 and losses == pytest.approx(summary["losses"]["train"], rel=1e-5)
    assert any("lr-AdamW" in row for row in run.history)
    (val_ppl,) = [row["val/ppl"] for row in run.history if "val/ppl" in row]
    assert val_ppl == pytest.approx(math.exp(summary["losses"]["val"][0]), rel=1e-5)
    curve = [(row["trainer/global_step"], row[CURVE_METRIC]) for row in run.history if CURVE_METRIC in row]
    assert curve == [(p["step"], pytest.approx(p["ppl"])) for p in summary["recovery_curve"]]
    assert [step for step, _ in curve] == [0, 8, 16]
    merged = summary["perplexity"]["merged"]
    assert run.summary["final/ppl_merged"] == pytest.approx(merged["ppl"])
    assert run.summary["final/ppl_merged_ci_low"] == pytest.approx(merged["ci_low"])
    assert run.summary["final/ppl_merged_ci_high"] == pytest.approx(merged["ci_high"])
    assert run.summary["final/perplexity/_type"] == "table-file"
    table_file = tmp / "run" / "wandb" / next((tmp / "run" / "wandb").glob("offline-run-*")).name / "files"
    table = json.loads(next(table_file.glob("media/table/final/perplexity_*.table.json")).read_text())
    rows = {row[0]: row for row in table["data"]}
    assert set(rows) == {"dense", "pruned", "merged"}
    assert rows["merged"][1:4] == pytest.approx([merged["ppl"], merged["ci_low"], merged["ci_high"]])
    assert "val/ppl" in (tmp / "run" / "csv" / "metrics.csv").read_text().splitlines()[0]


def test_adapter_and_merged_model_are_artifacts_naming_the_pruning_cache_key(wandb_run):
    _, job, summary, run = wandb_run
    by_type = {a["type"]: a for a in run.artifacts if a["type"] in ("adapter", "model")}
    assert set(by_type) == {"adapter", "model"}
    digest = pruning_identity(job).digest
    for art in by_type.values():
        assert art["metadata"]["pruning_cache_key"] == digest
        assert art["metadata"]["pruner"] == "wanda" and art["metadata"]["r"] == 16
        assert art["metadata"]["pruning_key"]["model"] == pruning_identity(job).model
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(by_type["adapter"]["paths"])
    assert {"config.json", "model.safetensors.index.json", "spp_export.json"} <= set(by_type["model"]["paths"])
    assert not any(p.endswith(".ckpt") for a in run.artifacts for p in a["paths"])  # no Lightning checkpoint
    assert sorted(summary["run"]["artifacts"]) == sorted(a["name"] for a in by_type.values())


def test_merged_model_is_not_uploaded_unless_asked(wandb_run, tmp_path):
    tmp, _, _, _ = wandb_run
    summary = run_job(tiny_job(tmp_path, "adapter=none", f"cache_dir={tmp / 'cache'}", "logger=[csv,wandb]"))
    run = read_offline_run(tmp_path / "run")
    assert summary["pruning"]["cache_hit"] is True
    assert not [a for a in run.artifacts if a["type"] in ("adapter", "model")]  # no adapter, log_model=false
    assert flatten(run.config)["adapter.name"] == "none"
    assert run.summary["final/ppl_merged"] == pytest.approx(summary["perplexity"]["merged"]["ppl"])


def _eval_job(*overrides: str):
    register_eval_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=["model=tiny", "eval.seqlen=64", "eval.max_windows=2",
                                             f"data_dir={SAMPLE_DATA_DIR}", "print_config=false", *overrides])
    return OmegaConf.to_object(cfg)


def test_eval_of_a_merged_folder_is_named_by_its_recorded_origin(wandb_run, tmp_path):
    tmp, job, summary, _ = wandb_run
    merged = tmp / "run" / "merged"
    run_eval_job(_eval_job(f"model.path={merged}", "logger=[csv,wandb]"), tmp_path / "eval")
    run = read_offline_run(tmp_path / "eval")
    assert run.name == summary["run"]["name"] == "tiny-wanda-nm2_4-spp-r16"  # not tiny-none-dense-none
    assert {"wanda", "nm2_4", "spp", "r16", "eval"} <= set(run.tags) and "dense" not in run.tags
    columns = flatten(run.config)
    assert (columns["origin.pruner"], columns["origin.sparsity"], columns["origin.r"]) == ("wanda", "nm2_4", 16)
    assert columns["origin.recorded_in"] == "spp_export.json" and columns["pruner.name"] == "none"
    assert columns["origin.pruning_cache_key"] == pruning_identity(job).digest  # the same pruned base as the run
    ppl = json.loads((tmp_path / "eval" / "results.json").read_text())["records"][0]["ppl"]["wikitext2"]
    assert run.summary["eval/ppl/wikitext2_ci_low"] == pytest.approx(ppl["ci_low"])
    assert run.summary["eval/perplexity/_type"] == "table-file" and run.summary["eval/perplexity/nrows"] == 1
    # negative control: the same weights in a folder without spp_export.json are named by the command line
    plain = tmp_path / "plain"
    plain.mkdir()
    for file in merged.iterdir():
        if file.name != "spp_export.json":
            (plain / file.name).symlink_to(file)
    run_eval_job(_eval_job(f"model.path={plain}", "logger=[csv,wandb]"), tmp_path / "eval-plain")
    other = read_offline_run(tmp_path / "eval-plain")
    assert other.name == "tiny-none-dense-none" and flatten(other.config)["origin.recorded_in"] == "command line"
    assert flatten(other.config)["origin.pruning_cache_key"] is None
