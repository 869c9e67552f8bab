"""Inputs whose failure is knowable before any work are refused in one line, exit 2.

The cases run the commands as a user would (``python train.py ...``: each script runs as ``__main__`` with the
user's ``sys.argv``), one after another in **one** subprocess (``RUNNER``) so that torch and Lightning are imported
once, with every Hugging Face weight loader replaced by a tripwire that exits 99: a refusal that came only after
loading weights fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cases
from train_helpers import tiny_job

from spp.errors import UserError
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from spp.preflight.shapes import check_shapes
from spp.training.val_schedule import first_validation_batch, no_validation_reason

SWEEP = ["-m", "hydra/sweeper=optuna_lr", "experiment=tiny_smoke"]


def _gpt2_dir(path: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=128, vocab_size=256, bos_token_id=0,
                        eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


def _merged_without_tokenizer(path: Path) -> Path:
    from spp.models.tiny import tiny_llama

    tiny_llama(seed=0).save_pretrained(path)  # config.json + model.safetensors, no tokenizer file
    return path


def _cases(tmp: Path) -> dict[str, list[str]]:
    """The command lines, in the order they run: those that stop before Hydra composes come first."""
    gpt2, merged = _gpt2_dir(tmp / "gpt2"), _merged_without_tokenizer(tmp / "merged")
    train = [f"cache_dir={tmp / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}"]
    return {
        "train": ["train.py", "model=tiny", "adapter.rr=16", f"hydra.run.dir={tmp / 'h1'}", *train],
        "train_multirun": ["train.py", "-m", "model=tiny", "adapter.rr=4,8", f"hydra.sweep.dir={tmp / 'h2'}", *train],
        "prune": ["prune.py", "model=tiny", "calibration.nsampels=3", f"hydra.run.dir={tmp / 'h3'}"],
        "eval": ["eval.py", "model=tiny", "eval.seqln=64", f"hydra.run.dir={tmp / 'h4'}"],
        "generate": ["generate.py", "model=tiny", "promt=hi", f"hydra.run.dir={tmp / 'h5'}"],
        "pruner_other": ["train.py", "model=tiny", "pruner=wanda", "pruner.blocksize=64", f"hydra.run.dir={tmp / 'h6'}",
                         *train],
        "pruner_typo": ["prune.py", "model=tiny", "pruner=sparsegpt", "pruner.blocksz=64",
                        f"hydra.run.dir={tmp / 'h7'}"],
        "pruner_option_typo": ["prune.py", "model=tiny", "pruner=sparsgpt", f"hydra.run.dir={tmp / 'h8'}"],
        "logger_option_typo": ["train.py", "model=tiny", "logger=[csv,wandbb]", f"hydra.run.dir={tmp / 'h9'}", *train],
        "train_plus": ["train.py", "model=tiny", "+adapter.rr=16", f"hydra.run.dir={tmp / 'h0'}", *train],
        "gpt2": ["train.py", f"model.path={gpt2}", "model.name=gpt2", "debug=fast", f"run_dir={tmp / 'gpt2_run'}",
                 "adapter.targets=[c_attn,q_proj]", *train],
        "no_tokenizer": ["generate.py", f"model.path={merged}", "max_new_tokens=2", f"hydra.run.dir={tmp / 'g1'}"],
        "test_objective": ["train.py", *SWEEP, "sweep_objective=ppl_merged", f"hydra.sweep.dir={tmp / 'sweep9'}",
                           *train],
        "no_validation": ["train.py", *SWEEP, f"hydra.sweep.dir={tmp / 'sweep18'}", *train],
        "sweep_bad_second_value": ["train.py", "-m", "model=tiny", "plan=true", "data.padding_side=right,middle",
                                   f"hydra.sweep.dir={tmp / 'sweep_pad'}", *train],
    }


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Any]:
    """``{case: (exit status, its stderr)}`` of every case of :func:`_cases`; ``tmp``: their folder."""
    tmp = tmp_path_factory.mktemp("refusals")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "PYTHONPATH": str(REPO_ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    cases = _cases(tmp)
    proc, outcomes = run_cases(cases, env, REPO_ROOT, 900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    found: dict[str, Any] = {"tmp": tmp, **outcomes}
    assert set(cases) <= set(found), proc.stderr[-5000:]
    return found


def refusal(outcome: tuple[Any, str], cmd: str, *names: str) -> str:
    """The one ``<cmd>: error: <what> — <fix>`` line of a case that exited 2 without a traceback or a weight load.

    Besides it, stderr may hold only Optuna's ``A new study created`` log line (the sweeper logs it first)."""
    code, err = outcome
    assert code == 2, (code, err[-3000:])
    assert "Traceback" not in err and "TRIPWIRE" not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip() and "A new study created" not in line]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"{cmd}: error: ") and " — " in line, line
    for name in names:
        assert name in line, (name, line)
    return line


def nothing_done(*roots: Path) -> None:
    """No trained, merged, evaluated or cached result anywhere under ``roots``."""
    for root in roots:
        for pattern in ("**/summary.json", "**/merged", "**/adapter", "**/checkpoints/*", "**/metrics.csv",
                        "**/manifest.json", "**/objective.json", "**/*.pt"):
            assert not list(root.glob(pattern)), (root, pattern)


# ------------------------------------------------ 7: a GPT-2 model (Conv1D) with a target its blocks do not have
def test_gpt2_target_it_does_not_have_is_refused_before_loading(outcomes):
    line = refusal(outcomes["gpt2"], "train.py", "adapter.targets", "'q_proj' matches no module of a GPT2Block")
    assert "['c_attn', 'c_proj', 'c_fc']" in line
    nothing_done(outcomes["tmp"] / "gpt2_run", outcomes["tmp"] / "cache")


def test_targets_matching_no_linear_layer():
    from transformers import GPT2Config, LlamaConfig

    from spp.adapters.registry import make_config
    from spp.pruning.config import PrunerConfig, SparsityConfig

    gpt2 = {**GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=256).to_dict(), "model_type": "gpt2"}
    llama = {**LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           vocab_size=256).to_dict(), "model_type": "llama"}
    pruner, sparsity = PrunerConfig(name="wanda"), SparsityConfig(name="nm2_4", kind="nm", n=2, m=4)
    check_shapes(gpt2, pruner=pruner, sparsity=sparsity, adapter=make_config("spp"))  # its Conv1D projections
    with pytest.raises(UserError, match=r"pruner.targets: 'q_proj' matches no module of a GPT2Block .*'c_fc'"):
        check_shapes(gpt2, pruner=PrunerConfig(name="wanda", targets=["q_proj"]), sparsity=sparsity)
    check_shapes(llama, pruner=pruner, sparsity=sparsity, adapter=make_config("spp"))
    with pytest.raises(UserError, match=r"adapter.targets: 'qproj' matches no module .* names among \["):
        check_shapes(llama, adapter=make_config("spp", targets=["qproj"]))
    with pytest.raises(UserError, match=r"adapter.targets: 'input_layernorm' is a LlamaRMSNorm .*not a linear"):
        check_shapes(llama, adapter=make_config("spp", targets=["q_proj", "input_layernorm"]))
    with pytest.raises(UserError, match=r"pruner.targets: 'c_attn'"):
        check_shapes(llama, pruner=PrunerConfig(name="wanda", targets=["c_attn"]), sparsity=sparsity)
    check_shapes({"hidden_size": 64}, pruner=pruner, sparsity=sparsity)  # no model_type: left to load time


# ------------------------------------------------------------------- 8: generate.py on a folder without a tokenizer
def test_generate_names_the_folder_without_tokenizer_files(outcomes):
    merged = str(outcomes["tmp"] / "merged")
    line = refusal(outcomes["no_tokenizer"], "generate.py", "model.path=", merged, "no tokenizer files",
                   "tokenizer=")
    assert "sentencepiece" not in line


def test_generate_takes_the_tokenizer_from_the_tokenizer_key(tmp_path):
    from spp.commands.generate import generate_one
    from spp.generation import GenerateJobConfig
    from spp.models.config import ModelConfig
    from spp.models.tiny import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    merged = _merged_without_tokenizer(tmp_path / "merged")
    job = GenerateJobConfig(model=ModelConfig(name="m", path=str(merged), torch_dtype="float32"), max_new_tokens=2,
                            tokenizer=str(tmp_path / "tokenizer"), device="cpu")
    result = generate_one(job, tmp_path / "gen.json")
    assert result.new_tokens > 0 and (tmp_path / "gen.json").is_file()


# ----------------------------------------------------------------------- 9, 18: Optuna sweeps that cannot select
def test_optuna_sweep_on_a_test_objective_is_one_line(outcomes):
    refusal(outcomes["test_objective"], "train.py", "sweep_objective=ppl_merged", "sweep_objective=val_loss")
    nothing_done(outcomes["tmp"] / "sweep9")


def test_optuna_sweep_whose_jobs_never_validate_is_refused_before_the_first_trial(outcomes):
    line = refusal(outcomes["no_validation"], "train.py", "sweep_objective=val_loss", "trainer.max_steps=6",
                   "trainer.val_check_interval=")
    assert "validation" in line
    nothing_done(outcomes["tmp"] / "sweep18")


def test_no_validation_reason_follows_lightnings_schedule(tmp_path):
    assert first_validation_batch(1.0, 8) == 8 and first_validation_batch(0.25, 8) == 2
    assert first_validation_batch(3, 8) == 3 and first_validation_batch(0.01, 8) == 1
    assert first_validation_batch("00:00:10:00", 8) is None
    # debug=fast: 29 training records of the 32 -> 8 batches of 4; training stops at step 6, validation at 8.
    assert "trainer.max_steps=6 stops after 6 of the epoch's 8" in no_validation_reason(tiny_job(tmp_path))
    for extra in (["trainer.val_check_interval=3"], ["trainer.val_check_interval=0.5"], ["trainer.max_steps=8"],
                  ["trainer.max_steps=-1"], ["data.train_on_inputs=false"]):
        assert no_validation_reason(tiny_job(tmp_path, *extra)) is None, extra
    assert "trainer.max_steps=2 stops after 4" in no_validation_reason(
        tiny_job(tmp_path, "trainer.max_steps=2", "trainer.accumulate_grad_batches=2"))
    for extra, key in ((["adapter=none"], "adapter=none"), (["data.val_size=0"], "data.val_size=0"),
                       (["trainer.limit_val_batches=0"], "trainer.limit_val_batches=0")):
        assert key in no_validation_reason(tiny_job(tmp_path, *extra)), extra


# ------------------------------------------------------------------------ 10: a misspelled key, with or without +
@pytest.mark.parametrize("case, cmd, key, suggestion", [
    ("train", "train.py", "adapter.rr", "adapter.r="),
    ("train_multirun", "train.py", "adapter.rr", "adapter.r="),
    ("prune", "prune.py", "calibration.nsampels", "calibration.nsamples="),
    ("eval", "eval.py", "eval.seqln", "eval.seqlen="),
    ("generate", "generate.py", "promt", "prompt="),
    ("pruner_typo", "prune.py", "pruner.blocksz", "pruner.blocksize="),  # judged by pruner=sparsegpt's own schema
])
def test_misspelled_key_without_plus_gets_the_projects_message(outcomes, case, cmd, key, suggestion):
    line = refusal(outcomes[case], cmd, f"unknown config key {key} ", f"did you mean {suggestion}?")
    assert "+" + key not in line  # not Hydra's advice to add the key
    if case == "train":
        assert line == refusal(outcomes["train_plus"], cmd)  # the same line as for +adapter.rr=16


def test_a_key_of_another_pruner_names_the_pruner_chosen_and_its_keys(outcomes):
    line = refusal(outcomes["pruner_other"], "train.py", "pruner=wanda has no key pruner.blocksize",
                   "its keys: name, targets, true_sequential", "pruner=sparsegpt")
    assert "+pruner" not in line


# ------------------------------------------------------------- a misspelled option of a config group
@pytest.mark.parametrize("case, cmd, bad, close, other", [
    ("pruner_option_typo", "prune.py", "pruner=sparsgpt", "pruner=sparsegpt", "wanda"),
    ("logger_option_typo", "train.py", "logger=wandbb", "logger=wandb", "tensorboard"),  # one item of a list
])
def test_a_misspelled_group_option_lists_the_user_facing_options(outcomes, case, cmd, bad, close, other):
    line = refusal(outcomes[case], cmd, f"{bad} is not an option of", f"did you mean {close}?", other)
    assert "_schema" not in line  # not Hydra's list with the internal typed entries


# ------------------------------------------ a basic sweep whose later job's typed config fails its value check
def test_a_sweep_value_its_job_would_refuse_is_refused_before_the_first_job(outcomes):
    """Hydra's basic launcher runs the jobs one after another and each converts its config only when it starts, so
    ``data.padding_side=right,middle`` would fail job 1 only after job 0 trained; it is one line before job 0."""
    line = refusal(outcomes["sweep_bad_second_value"], "train.py", "data.padding_side", "'middle'")
    assert "sweep job 1" in line, line
    assert not list((outcomes["tmp"] / "sweep_pad").glob("0_*")), "job 0 ran before the refusal"
