"""Hydra's submitit launchers with the project's commands: ``hydra/launcher=local`` (``submitit_local``) runs a
2-job sweep end to end as two processes with one pruning; ``hydra/launcher=slurm`` (``submitit_slurm``) composes
for train/prune/eval/generate and turns into the sbatch script a user expects; trainer.devices follows the GPUs
Slurm gave the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import submitit
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, LocalQueueConf, SlurmQueueConf
from omegaconf import OmegaConf

from spp.paths import CONF_DIR, REPO_ROOT, SAMPLE_DATA_DIR, SHARED_DATA_DIR

FAST = ["model=tiny", "debug=fast", "pruner=wanda", "sparsity=nm2_4", "eval=none", "dense_ppl=false",
        "pruned_ppl=false", f"data_dir={SAMPLE_DATA_DIR}"]
DEVICES_FROM_SLURM = "trainer.devices='${oc.decode:${oc.env:SLURM_GPUS_ON_NODE,1}}'"
COMMANDS = {"train": "train.py", "prune": "prune.py", "evaluate": "eval.py", "generate": "generate.py"}


def _register(config_name: str) -> None:
    if config_name == "train":
        from spp.training.config import register_train_schema as register_configs
    elif config_name == "prune":
        from spp.pruning.config import register_prune_schema as register_configs
    elif config_name == "evaluate":
        from spp.eval.job_config import register_eval_schema as register_configs
    else:
        from spp.generation import register_generate_schema as register_configs
    register_configs()


def _compose(config_name: str, overrides: list[str]):
    _register(config_name)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name, overrides=overrides, return_hydra_config=True)


def _sbatch_script(cfg, folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The sbatch file the Slurm launcher would submit, built as ``SlurmLauncher.launch`` builds its executor
    (``srun`` is faked as present: this machine is no Slurm cluster)."""
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    launcher = instantiate(cfg.hydra.launcher)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in launcher.params.items()
                                  if k not in {"submitit_folder", "max_num_timeout"}})
    return executor._executor._make_submission_file_text("python -u -m submitit.core._submit", "uid")


@pytest.mark.parametrize("config_name", list(COMMANDS))
def test_slurm_launcher_composes_for_every_command(config_name, tmp_path, monkeypatch):
    cfg = _compose(config_name, ["hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                                 "hydra.launcher.gpus_per_node=4", "hydra.launcher.mem_gb=120",
                                 "hydra.launcher.timeout_min=600", "hydra.job.name=spp",
                                 "hydra.launcher.setup=['module load cuda','export SPP_CACHE_DIR=/shared/spp-cache']"])
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.spp_slurm_launcher.PlannedSlurmLauncher"  # planned (docs/plan.md)
    assert launcher.tasks_per_node == 4, "one process per GPU, as Lightning's SLURM environment expects"
    script = _sbatch_script(cfg, tmp_path, monkeypatch)
    for flag in ("--partition=gpu", "--gpus-per-node=4", "--ntasks-per-node=4", "--mem=120GB", "--time=600",
                 "--cpus-per-task=8", "--job-name=spp"):
        assert f"#SBATCH {flag}\n" in script, (flag, script)
    setup = script.index("module load cuda")
    assert setup < script.index("export SPP_CACHE_DIR=/shared/spp-cache") < script.index("srun")


def test_project_launcher_configs_only_set_plugin_fields():
    """Every key of conf/hydra/launcher/*.yaml is a field of the plugin's typed config (no silent typos)."""
    for name, schema in (("slurm", SlurmQueueConf), ("local", LocalQueueConf)):
        own = OmegaConf.load(CONF_DIR / "hydra" / "launcher" / f"{name}.yaml")
        own.pop("defaults")
        unknown = set(own) - set(OmegaConf.structured(schema))
        assert not unknown, (name, unknown)


@pytest.mark.parametrize("override", ["trainer=slurm", DEVICES_FROM_SLURM])
def test_trainer_devices_follow_slurm_gpus(override, monkeypatch):
    monkeypatch.delenv("SLURM_GPUS_ON_NODE", raising=False)
    monkeypatch.delenv("SLURM_NNODES", raising=False)
    cfg = _compose("train", [override])
    assert (cfg.trainer.devices, cfg.trainer.num_nodes) == (1, 1)
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    monkeypatch.setenv("SLURM_NNODES", "2")
    cfg = _compose("train", [override])
    assert cfg.trainer.devices == 4 and isinstance(cfg.trainer.devices, int)
    assert cfg.trainer.num_nodes == (2 if override == "trainer=slurm" else 1)
    if override == "trainer=slurm":
        assert (cfg.trainer.accelerator, cfg.trainer.precision) == ("gpu", "bf16-mixed")  # the GPU recipe

@pytest.mark.slow  # two train.py jobs through submitit (19 s)
def test_submitit_local_two_jobs_one_pruning(tmp_path):
    """Two jobs of one sweep run at once as two submitit processes; the pruning cache's lock makes one prune and
    the other wait and hit; each job writes its own run and merged model. (csv logger only, to stay under a minute
on a loaded 2-core machine; one W&B run per job is checked by tests/test_train_multirun.py.)"""
    sweep = tmp_path / "sweep"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    args = ["-m", "hydra/launcher=local", "hydra.launcher.timeout_min=10", "adapter.r=4,8", *FAST,
            f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}", "logger=csv"]
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    logs = sorted((sweep / ".submitit").glob("*/*_0_log.out"))
    assert len(logs) == 2, "two submitit jobs (separate processes), each with its own log"
    runs = sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file())
    assert [r.name.split("_")[0] for r in runs] == ["0", "1"], list(sweep.iterdir())
    summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
    assert [s["run"]["r"] for s in summaries] == [4, 8]
    assert sorted(s["pruning"]["cache_hit"] for s in summaries) == [False, True], "exactly one job pruned"
    assert len(list((tmp_path / "cache" / "pruning").glob("*/*[!.lock]"))) == 1
    for run, summary in zip(runs, summaries, strict=True):
        assert (run / "merged" / "model.safetensors.index.json").is_file()
        assert summary["sparsity"]["after"] == summary["sparsity"]["before"] == 0.5


# --- Optuna: learning rate on a validation objective -------------------------------------------------------------

AUDIT_WRAPPER = """
import os, runpy, sys
log = open(os.environ["SPP_OPEN_LOG"], "a")
def hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        log.write(os.path.abspath(os.fsdecode(args[0])) + "\\n")
        log.flush()
sys.addaudithook(hook)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""
"""Runs train.py with an audit hook that logs the path of every file the process opens (the Optuna sweep's jobs
run in this process: Hydra's basic launcher)."""


def test_optuna_lr_sweeper_config():
    cfg = _compose("generate", ["hydra/sweeper=optuna_lr"])
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert sweeper.params["trainer.lr"] == "tag(log, interval(1e-5, 1e-1))"
    assert sweeper.params.sweep_objective == "val_loss"
    assert sweeper.params["guards.enabled"] is False
    assert (sweeper.direction, sweeper.n_trials, sweeper.sampler.seed) == ("minimize", 12, 0)
    assert cfg.hydra.callbacks.sweep_trials.direction == "minimize"


def test_validation_objective_required_under_optuna():
    from hydra.core.hydra_config import HydraConfig

    from spp.sweeps import require_validation_objective

    saved = HydraConfig.instance().cfg
    try:
        for sweeper, objective, refused in (("optuna_lr", "ppl_merged", True), ("optuna_lr", "val_loss", False),
                                            ("basic", "ppl_merged", False)):
            cfg = _compose("generate", [f"hydra/sweeper={sweeper}", "hydra.mode=MULTIRUN"])
            HydraConfig.instance().set_config(cfg)
            if refused:
                with pytest.raises(ValueError, match="sweep_objective=ppl_merged: .* set sweep_objective=val_loss"):
                    require_validation_objective(objective)
            else:
                require_validation_objective(objective)
    finally:
        HydraConfig.instance().cfg = saved


def _last_val_loss(metrics_csv: Path) -> float:
    import csv

    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("val/loss")]
    return float(rows[-1]["val/loss"])


@pytest.mark.slow  # a long subprocess check (the default suite stays under 10 minutes); CI runs it
def test_optuna_three_trials_on_validation_loss_without_test_split(tmp_path):
    assert "sweep_objective" in _compose("train", []), "train.py returns the `sweep_objective` key's value to sweepers"
    sweep, opened = tmp_path / "sweep", tmp_path / "opened.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
           "SPP_OPEN_LOG": str(opened)}
    # validation every 3 of the 6 fast steps (debug=fast stops before the epoch's end, where it would run)
    args = ["-m", "hydra/sweeper=optuna_lr", "hydra.sweeper.n_trials=3", *FAST, "logger=csv",
            "trainer.val_check_interval=3", f"cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run([sys.executable, "-c", AUDIT_WRAPPER, *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((sweep / "trials.json").read_text())
    trials = record["trials"]
    assert len(trials) == 3 and all(t["status"] == "COMPLETED" for t in trials)
    lrs = [float(next(o for o in t["overrides"] if o.startswith("trainer.lr=")).split("=")[1]) for t in trials]
    assert len(set(lrs)) == 3 and all(1e-5 <= lr <= 1e-1 for lr in lrs)
    for trial in trials:
        run = Path(trial["run_dir"])
        assert trial["sweep_objective"] == "val_loss"
        assert trial["value"] == pytest.approx(_last_val_loss(run / "csv" / "metrics.csv"), rel=1e-6)
        summary = json.loads((run / "summary.json").read_text())
        assert all(v is None for v in summary["perplexity"].values()), "no perplexity was measured"
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert best.best_value == min(t["value"] for t in trials)
    assert trials[record["best_job"]]["value"] == best.best_value
    # The proof that no test split was read: every file the sweep's process opened, none a test split.
    roots = [str(SAMPLE_DATA_DIR), str(SHARED_DATA_DIR)]
    data_files = {p for p in opened.read_text().splitlines() if p.startswith(tuple(roots))}
    assert any("alpaca" in p for p in data_files), "the audit hook saw the training data being opened"
    test_files = sorted(p for p in data_files if any("test" in part for part in Path(p).parts[-3:]))
    assert not test_files, test_files  # e.g. wikitext2/test.json: never opened
