"""Every option of every group of ``conf/train.yaml`` composes into the typed job; bad keys fail clearly."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
from omegaconf import OmegaConf
from train_helpers import compose_train
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from spp.paths import CONF_DIR
from spp.training.config import TrainJobConfig, load_job
from spp.training.strategies import AdapterFSDPStrategy, build_strategy, decoder_layer_class

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF_DIR / g).glob("*.yaml"))]
PAPER = {  # docs/design.md §1: lr, per-device batch, epochs
    "llama7b": (4e-3, 8, 3), "llama13b": (2e-3, 4, 3), "llama30b": (4e-3, 16, 3),
    "llama65b": (5e-4, 8, 1), "llama2_70b": (5e-4, 8, 1),
}
TRAIN_GROUPS = {"budget", "model", "pruner", "sparsity", "calibration", "adapter", "data", "trainer", "strategy",
                "logger", "eval", "experiment", "debug"}


def _error_text(err: BaseException) -> str:
    parts = []
    while err is not None:
        parts.append(str(err))
        err = err.__cause__ or err.__context__
    return "\n".join(parts)


def test_every_train_group_exists():
    assert TRAIN_GROUPS <= set(GROUPS)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_into_typed_job(group, option):
    cfg = compose_train([f"{group}={option}"])
    assert OmegaConf.get_type(cfg) is TrainJobConfig
    job = OmegaConf.to_object(cfg)  # resolves every interpolation and checks every type
    assert isinstance(job, TrainJobConfig)
    if group in ("experiment", "debug", "budget"):
        return
    node = cfg[group]
    if group == "logger":
        assert node[option if option != "many" else "wandb"] is not None
    elif "name" in node and group not in ("calibration",):
        assert node.name
    for validatable in ("pruner", "sparsity", "calibration", "data"):
        getattr(job, validatable).validate()


def test_yaml_files_start_with_a_usage_comment():
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        lines = path.read_text().splitlines()
        assert lines and lines[0].startswith("#"), path
        header = [line for line in lines[: next((i for i, x in enumerate(lines) if not x.startswith("#")), len(lines))]]
        assert any("python " in line for line in header), f"{path}: no usage command in the header comment"


def test_logger_several_at_once():
    cfg = compose_train(["logger=[csv,wandb,tensorboard]"])
    assert cfg.logger.csv.name == "csv" and cfg.logger.wandb.project == "spp" and cfg.logger.tensorboard
    assert compose_train(["logger=many"]).logger.tensorboard.name == "tensorboard"
    assert compose_train([]).logger.wandb is None


@pytest.mark.parametrize("model", sorted(PAPER))
def test_per_model_paper_defaults_flow_into_trainer_and_data(model):
    cfg = compose_train([f"model={model}"])
    lr, batch, epochs = PAPER[model]
    assert (cfg.trainer.lr, cfg.data.train_batch_size, cfg.trainer.max_epochs) == (lr, batch, epochs)
    overridden = compose_train([f"model={model}", "trainer.lr=1e-4", "data.train_batch_size=2"])
    assert (overridden.trainer.lr, overridden.data.train_batch_size) == (1e-4, 2)


def test_misspelled_key_fails_naming_it():
    with pytest.raises(ConfigCompositionException) as err:
        compose_train(["adapter.rr=4"])
    assert "rr" in _error_text(err.value) and "AdapterConfig" in _error_text(err.value)
    with pytest.raises(ConfigCompositionException) as err:
        compose_train(["trainer.max_step=10"])
    assert "max_step" in _error_text(err.value)


def test_wrong_type_fails_naming_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose_train(["adapter.r=sixteen"])
    text = _error_text(err.value)
    assert "adapter.r" in text or "'r'" in text or "r=" in text
    with pytest.raises(ConfigCompositionException) as err:
        compose_train(["trainer.gradient_checkpointing=maybe"])
    assert "gradient_checkpointing" in _error_text(err.value)


def test_misspelled_key_in_a_group_file_fails(tmp_path):
    bad = tmp_path / "adapter"
    bad.mkdir()
    (bad / "typo.yaml").write_text("# Use: python train.py adapter=typo\nname: spp\nrank: 8\n")
    with pytest.raises(ConfigCompositionException) as err:
        compose_train([f"hydra.searchpath=[file://{tmp_path}]", "adapter=typo"])
    assert "rank" in _error_text(err.value)


@pytest.mark.parametrize("option", sorted(f.stem for f in (CONF_DIR / "strategy").glob("*.yaml")))
def test_every_strategy_instantiates(option):
    job = load_job(compose_train([f"strategy={option}", "trainer.accelerator=cpu"]))
    if job.strategy.name == "deepspeed":
        with pytest.raises((ImportError, ValueError), match="deepspeed|DeepSpeed"):
            build_strategy(job.strategy, "cpu")  # not installed here, and GPU-only anyway
        return
    strategy = build_strategy(job.strategy, "cpu", world_size=2)
    expected = {"auto": str, "ddp": DDPStrategy, "fsdp": AdapterFSDPStrategy, "deepspeed": DeepSpeedStrategy}
    assert isinstance(strategy, expected[job.strategy.name])
    if isinstance(strategy, (DDPStrategy, AdapterFSDPStrategy)):
        assert strategy._process_group_backend == "gloo"
    if isinstance(strategy, AdapterFSDPStrategy):  # FSDP2: one data-parallel mesh over every process
        assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (2, 1)


def test_decoder_layer_class_resolution_and_error():
    assert decoder_layer_class("LlamaDecoderLayer") is LlamaDecoderLayer
    with pytest.raises(ValueError, match="model.decoder_layer_cls"):
        decoder_layer_class("NoSuchLayer")


def test_the_budget_never_overrides_an_explicit_choice():
    """The default model's CPU budget comes before the groups: explicit options win for what they set."""
    base = compose_train([])
    assert (base.eval.name, base.eval.seqlen, base.eval.max_windows) == ("cpu_budget", 512, 40)
    assert base.eval.window_sampling == "systematic"
    assert (base.data.max_examples, base.data.max_length, base.trainer.lr) == (120, 128, 2e-2)
    paper = compose_train(["eval=paper"])
    assert (paper.eval.name, paper.eval.seqlen, paper.eval.max_windows) == ("paper", 2048, None)
    assert list(paper.eval.tasks) == ["spp_zeroshot", "spp_mmlu"]
    assert (paper.data.max_examples, paper.trainer.lr) == (120, 2e-2)  # the budget keeps what eval does not set
    cleaned = compose_train(["data=alpaca_cleaned"])
    assert (cleaned.data.name, cleaned.data.max_examples, cleaned.data.max_length) == ("alpaca_cleaned", None, 512)
    full = compose_train(["budget=none"])
    assert (full.eval.seqlen, full.data.max_examples, full.trainer.lr) == (2048, None, 4e-3)


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_train_cfg_job_shows_the_chosen_eval():
    """``python train.py eval=paper --cfg job`` on the default model prints eval = paper (composition only)."""
    import subprocess
    import sys

    import yaml

    from spp.paths import REPO_ROOT

    proc = subprocess.run([sys.executable, "train.py", "eval=paper", "--cfg", "job"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    job = yaml.safe_load(proc.stdout)
    assert job["eval"]["name"] == "paper" and job["eval"]["tasks"] == ["spp_zeroshot", "spp_mmlu"]
    assert job["data"]["max_examples"] == 120
