"""``train.py plan=true`` and the plan check at the command line and at Slurm submission (``docs/plan.md``).

The command-line cases run as a user would run them, one after another in one subprocess (torch imported once),
with every Hugging Face weight loader replaced by a tripwire that exits 99 and an audit hook that records every
data, weight or checkpoint file opened: a plan or a refusal that read one fails the test.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import submitit
from hydra import compose, initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.types import HydraContext
from hydra.utils import instantiate

from spp.paths import CONF_DIR, REPO_ROOT, SAMPLE_DATA_DIR
from spp.planning.hardware import GIB

MARK = "@@case-done"
DATA_DIRS = tuple(sorted({str(REPO_ROOT / "data") + os.sep, str(SAMPLE_DATA_DIR) + os.sep}))
"""Where the data files live (the shipped samples); a plan opens nothing there."""
RUNNER = f"""
import time
START = time.time()
import json, os, runpy, sys, traceback
def audit(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.endswith((".safetensors", ".gguf", ".bin", ".pt", ".ckpt")) or path.startswith({DATA_DIRS!r}):
            print(f"OPENED {{path}}", file=sys.stderr, flush=True)
sys.addaudithook(audit)
import transformers
from hydra.core.global_hydra import GlobalHydra

def refuse(*args, **kwargs):
    print("TRIPWIRE: model weights were loaded", file=sys.stderr, flush=True)
    raise SystemExit(99)

transformers.AutoModelForCausalLM.from_pretrained = refuse
transformers.PreTrainedModel.from_pretrained = classmethod(refuse)
for name, argv in json.loads(sys.argv[1]):
    sys.argv, code = list(argv), 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = "exception"
    GlobalHydra.instance().clear()
    for stream in (sys.stdout, sys.stderr):
        print(f"{MARK} {{name}} {{code}} {{time.time() - START:.1f}} {{time.process_time():.1f}}", file=stream,
              flush=True)
"""


def _cases(tmp: Path) -> dict[str, list[str]]:
    refused = ["model=llama2_70b", "trainer.devices=1", "strategy=ddp", "trainer.accelerator=gpu",
               "trainer.device_memory_gib=80", "trainer.host_memory_gib=2048"]
    return {
        "plan70": ["train.py", "model=llama2_70b", "plan=true", "trainer.devices=8", "strategy=fsdp",
                   f"hydra.run.dir={tmp / 'plan70'}"],
        "deepspeed": ["train.py", "experiment=llama30b_deepspeed", "plan=true", "trainer.devices=8",
                      f"hydra.run.dir={tmp / 'deepspeed'}"],
        "json": ["train.py", "model=llama7b", "plan=true", "plan_json=-", "trainer=gpu", "data=alpaca_cleaned",
                 f"hydra.run.dir={tmp / 'json'}"],
        "refused": ["train.py", *refused, f"run_dir={tmp / 'run'}", f"cache_dir={tmp / 'cache'}",
                    f"data_dir={SAMPLE_DATA_DIR}"],
        "slurm_mem": ["train.py", "-m", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=8",
                      "hydra.launcher.mem_gb=64", "trainer=slurm", "strategy=fsdp", "model=llama2_70b",
                      f"hydra.sweep.dir={tmp / 'sweep'}"],
    }


def _split(text: str) -> dict[str, tuple[Any, float, float, str]]:
    """``{case: (exit status, wall seconds and CPU seconds since the runner started, its output)}`` of one stream."""
    found, lines = {}, []
    for line in text.splitlines():
        if line.startswith(MARK):
            _, name, code, seconds, cpu = line.split()
            found[name] = (int(code) if code.lstrip("-").isdigit() else code, float(seconds), float(cpu),
                           "\n".join(lines))
            lines = []
        else:
            lines.append(line)
    return found


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Any]:
    """``{case: {"code", "seconds", "out", "err"}}`` of every case of :func:`_cases`."""
    tmp = tmp_path_factory.mktemp("plan_cli")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    cases = _cases(tmp)
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(list(cases.items()))], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    out, err = _split(proc.stdout), _split(proc.stderr)
    assert set(cases) <= set(out) and set(cases) <= set(err), proc.stderr[-5000:]
    return {n: {"code": err[n][0], "seconds": err[n][1], "cpu": err[n][2], "out": out[n][3], "err": err[n][3],
                "tmp": tmp} for n in cases}


def _clean(case: dict[str, Any]) -> None:
    assert "TRIPWIRE" not in case["err"] and "Traceback" not in case["err"], case["err"][-3000:]
    assert "OPENED" not in case["err"], [line for line in case["err"].splitlines() if "OPENED" in line]


def test_plan_of_70b_on_8_gpus_prints_every_phase_in_under_30_s(outcomes):
    case = outcomes["plan70"]
    assert case["code"] == 0
    _clean(case)
    out = case["out"]
    for phase in ("load", "prune", "fit", "export", "evaluate"):
        assert f"\n{phase} " in out, out
    assert "FSDP2 on 8 GPU(s)" in out and "GPU GiB/device" in out and "fits: every phase" in out
    assert "2 x 4 GPUs" in out  # evaluation: 2 replicas of 4 GPUs (parallelize)
    # CPU seconds of the process (imports included): a shared machine's load stretches the wall time, not this
    assert case["cpu"] < 30, f"{case['cpu']} CPU s ({case['seconds']} s wall, load {os.getloadavg()}) from start"


def test_the_authors_deepspeed_recipe_is_planned_without_deepspeed(outcomes):
    case = outcomes["deepspeed"]
    assert case["code"] == 0
    _clean(case)
    assert "ZeRO-3 on 8 GPU(s)" in case["out"] and "llama30b" in case["out"]


def test_plan_as_json(outcomes):
    case = outcomes["json"]
    assert case["code"] == 0
    _clean(case)
    plan = json.loads(case["out"])
    assert plan["model"] == "llama7b" and [p["name"] for p in plan["phases"]] == ["load", "prune", "fit", "export",
                                                                                   "evaluate"]
    assert plan["eval_placement"]["how"] == "data_parallel" and plan["problems"] == []


def test_what_cannot_fit_is_refused_in_one_line_before_any_weight(outcomes):
    case = outcomes["refused"]
    assert case["code"] == 2, case["err"][-3000:]
    _clean(case)
    lines = [line for line in case["err"].strip().splitlines() if line.strip()]
    assert len(lines) == 1, case["err"]
    line = lines[0]
    assert line.startswith("train.py: error: the fit phase of llama2_70b"), line
    for part in ("GiB per GPU", "trainer.device_memory_gib=80", "DDP on 1 device(s)", "set strategy=fsdp"):
        assert part in line, (part, line)
    run = outcomes["refused"]["tmp"] / "run"  # Hydra's record and the log land in run_dir; nothing of the job does
    assert not run.exists() or {p.name for p in run.iterdir()} <= {".hydra", "train.log"}, sorted(run.iterdir())


def test_slurm_submission_below_the_plan_is_refused_in_one_line(outcomes):
    case = outcomes["slurm_mem"]
    assert case["code"] == 2, case["err"][-3000:]
    _clean(case)
    lines = [line for line in case["err"].strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "hydra.launcher.mem_gb=64 is below the plan's" in lines[0], case["err"]


# ------------------------------------------------------------------------------------ Slurm, resolved in-process
def _launch(overrides: list[str], jobs: list[list[str]], tmp: Path, monkeypatch) -> dict[str, Any]:
    """What ``hydra/launcher=slurm`` hands submitit for ``jobs`` (``sbatch`` replaced by a recorder)."""
    from spp.training.config import register_train_schema

    register_train_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"hydra.sweep.dir={tmp}"], return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF_DIR)))
    launcher.setup(hydra_context=HydraContext(config_loader=loader, callbacks=Callbacks(cfg)),
                   task_function=lambda _cfg: None, config=cfg)
    seen: dict[str, Any] = {}

    class Recorder:
        def __init__(self, **kwargs: Any) -> None:
            seen["init"] = kwargs

        def update_parameters(self, **kwargs: Any) -> None:
            seen.update(kwargs)

        def map_array(self, *args: Any) -> list:
            seen["jobs"] = len(args[1])
            return []

    monkeypatch.setattr(submitit, "AutoExecutor", Recorder)
    launcher.launch([[*overrides, *job] for job in jobs], 0)
    return seen


def test_slurm_memory_request_comes_from_the_largest_plan_of_the_array(tmp_path, monkeypatch):
    from spp.planning.job import plan_job
    from spp.preflight.model_files import model_arch
    from spp.training.config import load_job

    base = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=8", "trainer=slurm", "strategy=fsdp"]
    seen = _launch(base, [["model=llama2_7b"], ["model=llama2_70b"]], tmp_path, monkeypatch)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        job = load_job(compose("train", overrides=["trainer=slurm", "strategy=fsdp", "model=llama2_70b"]))
    plan = plan_job(job, model_arch(job.model), "gpu", "hub", devices=8, nodes=1)
    assert seen["mem_gb"] == math.ceil(plan.peak_host_node_bytes / GIB * 1.10 + 2)  # 70B decides: 180 GB
    assert (seen["gpus_per_node"], seen["tasks_per_node"], seen["jobs"]) == (8, 8, 2)
    assert 160 < plan.peak_host_node_bytes / GIB < 1.5 * plan.spec.shape.weight_bytes / GIB


def _refused(base: list[str], tmp_path, monkeypatch, capsys) -> str:
    """The one line (exit 2, nothing submitted) with which the Slurm launcher refuses ``base``."""
    with pytest.raises(SystemExit) as exc:
        _launch(base, [[]], tmp_path, monkeypatch)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_slurm_task_count_must_match_the_gpus(tmp_path, monkeypatch, capsys):
    base = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4", "hydra.launcher.tasks_per_node=1",
            "trainer=slurm", "strategy=fsdp", "model=llama2_7b"]
    assert "hydra.launcher.tasks_per_node=1 but gpus_per_node=4" in _refused(base, tmp_path, monkeypatch, capsys)


def test_slurm_node_count_must_match_the_trainers(tmp_path, monkeypatch, capsys):
    """hydra.launcher.nodes=2 with trainer.num_nodes=1 is refused before sbatch (Lightning would refuse it only on the
    node, after the queue); trainer.num_nodes=2 (or trainer=slurm) passes."""
    base = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4", "hydra.launcher.nodes=2", "trainer=gpu",
            "trainer.devices=4", "strategy=fsdp", "model=llama2_7b"]
    err = _refused(base, tmp_path, monkeypatch, capsys)
    assert "trainer.num_nodes=1 but the Slurm job asks hydra.launcher.nodes=2" in err
    assert _launch(base, [["trainer.num_nodes=2"]], tmp_path, monkeypatch)["nodes"] == 2


def test_slurm_cpu_jobs_run_one_task(tmp_path, monkeypatch, capsys):
    """gpus_per_node=0 leaves tasks_per_node at ${.gpus_per_node} = 0 tasks: refused in one line before sbatch."""
    base = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "trainer=cpu", "model=tiny"]
    assert "hydra.launcher.tasks_per_node=0 but gpus_per_node=0" in _refused(base, tmp_path, monkeypatch, capsys)
    seen = _launch([*base, "hydra.launcher.tasks_per_node=1"], [[]], tmp_path, monkeypatch)
    assert (seen["tasks_per_node"], seen["jobs"]) == (1, 1)
