"""Bad inputs answered in one line (exit 2) before any weight is read, and command lines the runs print that work
as printed: ``trainer.devices`` / ``num_nodes`` / memory figures, host memory per node in the plan, a tokenizer
larger than the model's vocabulary, ``generate.py max_new_tokens=0``, ``eval.py`` on a folder without tokenizer
files, and the "resume with" line of a ``run_dir`` with a space or a non-ASCII letter."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from cli_runner import run_cases
from train_helpers import compose_train

from spp.errors import UserError
from spp.paths import REPO_ROOT, SAMPLE_DATA_DIR
from spp.planning.check import problems
from spp.planning.job import ASSUMED_NODE_HOST_GIB, plan_hardware, plan_job
from spp.preflight.model_files import model_arch
from spp.training.callbacks.adapter_checkpoint import resume_command
from spp.training.config import load_job


def _cases(tmp: Path) -> dict[str, list[str]]:
    from spp.models.tiny import tiny_llama

    merged = tmp / "merged"
    tiny_llama(seed=0).save_pretrained(merged)  # config.json + model.safetensors, no tokenizer file
    run = [f"cache_dir={tmp / 'cache'}", f"data_dir={SAMPLE_DATA_DIR}", "model=tiny", "debug=fast"]
    return {
        "devices0": ["train.py", "plan=true", "trainer.devices=0"],
        "nodes0": ["train.py", *run, "trainer.num_nodes=0", f"run_dir={tmp / 'r1'}"],
        "inf": ["train.py", "plan=true", "trainer.device_memory_gib=inf"],
        "vocab": ["train.py", *run, "objective=distill", "+model.arch.vocab_size=128", f"run_dir={tmp / 'r2'}"],
        "tokens0": ["generate.py", "model=tiny", "max_new_tokens=0", f"hydra.run.dir={tmp / 'g'}"],
        "eval_no_tokenizer": ["eval.py", f"model.path={merged}", "eval.seqlen=64", "eval.tasks=[]",
                              f"data_dir={SAMPLE_DATA_DIR}", f"hydra.run.dir={tmp / 'e'}"],
    }


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[object, str]]:
    """``{case: (exit status, stderr)}``."""
    tmp = tmp_path_factory.mktemp("bad_inputs")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    cases = _cases(tmp)
    proc, found = run_cases(cases, env, REPO_ROOT, 600)
    assert set(cases) <= set(found), proc.stderr[-4000:]
    return found


def _one_line(outcome: tuple[object, str], command: str) -> str:
    code, err = outcome
    errors = [line for line in err.splitlines() if line.startswith(f"{command}: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err and "TRIPWIRE" not in err, err[-3000:]
    return errors[0]


@pytest.mark.parametrize(("case", "words"), [("devices0", "trainer.devices=0"), ("nodes0", "trainer.num_nodes=0"),
                                             ("inf", "trainer.device_memory_gib=inf")])
def test_device_counts_and_memory_figures_are_refused(outcomes, case: str, words: str) -> None:
    assert words in _one_line(outcomes[case], "train.py")


def test_tokenizer_larger_than_the_vocabulary_is_refused(outcomes) -> None:
    line = _one_line(outcomes["vocab"], "train.py")
    assert "has 260 tokens but the model's vocabulary (vocab_size) has 128" in line


def test_generate_max_new_tokens_0_is_refused_by_the_config(outcomes) -> None:
    assert "max_new_tokens=0 must be >= 1" in _one_line(outcomes["tokens0"], "generate.py")


def test_eval_names_the_folder_without_tokenizer_files(outcomes) -> None:
    line = _one_line(outcomes["eval_no_tokenizer"], "eval.py")
    assert "model.path=" in line and "merged" in line and "holds no tokenizer files" in line


def test_plan_checks_host_memory_per_node() -> None:
    """100,000 processes on one node: the plan (``plan=true``'s machine: a GPU node's assumed host memory) does not
    fit its host memory; 8 does (negative control)."""
    for devices, fits in ((100000, False), (8, True)):
        job = load_job(compose_train(["model=llama7b", "strategy=fsdp", f"trainer.devices={devices}"]))
        hw, sources = plan_hardware(job, "gpu")
        assert hw.host_gib == ASSUMED_NODE_HOST_GIB and "assumed" in sources["host"]
        found = problems(plan_job(job, model_arch(job.model), "gpu", "hub", hw))
        assert (not any(p.memory == "host" for p in found)) == fits, found


def test_plan_checks_every_node_not_only_rank_0s() -> None:
    job = load_job(compose_train(["model=llama7b", "strategy=fsdp", "trainer.devices=8", "trainer.num_nodes=2",
                                  "trainer.host_memory_gib=20"]))
    hw, _ = plan_hardware(job, "gpu")
    plan = plan_job(job, model_arch(job.model), "gpu", "hub", hw)
    others = [p for p in problems(plan) if p.memory == "host of another node"]
    assert others and all(p.need == next(ph for ph in plan.phases if ph.name == p.phase).host_other_node
                          for p in others)


@pytest.mark.parametrize("name", ["run dir", "rün ü", "a,b=c", "it's", "${oops}", "back\\slash'q\\", "[x]"])
def test_resume_line_composes_back_to_the_run_dir(tmp_path: Path, name: str) -> None:
    """The printed line, split as a shell splits it and composed by Hydra, gives back the run's ``run_dir``."""
    run_dir = tmp_path / name
    words = shlex.split(resume_command(run_dir, ["model=tiny", "adapter.r=8"]))
    assert words[:2] == ["python", "train.py"] and words[-1] == "trainer.resume_from=last"
    cfg = compose_train(words[2:])
    assert cfg.run_dir == str(run_dir) and cfg.adapter.r == 8 and cfg.trainer.resume_from == "last"


def test_generate_config_refuses_bad_values() -> None:
    from spp.generation import GenerateJobConfig

    for bad in ({"max_new_tokens": 0}, {"warmup": -1}, {"do_sample": True, "top_p": 0.0}):
        with pytest.raises(ValueError, match=next(iter(k for k in bad if k != "do_sample"))):
            GenerateJobConfig(**bad)
    GenerateJobConfig(max_new_tokens=1)


def test_refusals_are_user_errors() -> None:
    from spp.models.config import ModelConfig
    from spp.preflight.vocab import check_vocab

    with pytest.raises(UserError, match="vocab_size"):
        check_vocab(ModelConfig(name="tiny", path="tiny"), {"vocab_size": 100})
    check_vocab(ModelConfig(name="tiny", path="tiny"), {"vocab_size": 260})
