"""``run_dir=`` names the output folder of all four commands: the job's files, its ``<script>.log`` and ``.hydra/``
land there on a single run; the old keys (``output_dir=``, ``output_file=``) are refused in one line naming
``run_dir``, before any model is loaded.

The commands run in this process through their own Hydra entry (as ``tests/test_writable_dirs.py`` does)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from spp.commands.entry import register_run_dir_resolver
from spp.eval.run_name import register_eval_resolvers
from spp.paths import CONF_DIR, SAMPLE_DATA_DIR

ARGS = {
    "prune": ["model=tiny", "pruner=magnitude", "sparsity=nm2_4", "calibration=quick", "use_cache=false"],
    "eval": ["model=tiny", "pruner=magnitude", "sparsity=nm2_4", "calibration=quick", "eval.seqlen=64",
             "eval.max_windows=2", "eval.tasks=[]", f"data_dir={SAMPLE_DATA_DIR}", "use_cache=false"],
    "generate": ["model=tiny", "max_new_tokens=3", "device=cpu"],
}
RESULT = {"prune": "mask_summary.json", "eval": "results.json", "generate": "generation.json"}
CONFIG_NAME = {"train": "train", "prune": "prune", "eval": "evaluate", "generate": "generate"}


def run_cli(cmd: str, args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """``<cmd>.py args`` in this process; (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", [f"{cmd}.py", *args])
    capsys.readouterr()
    try:
        importlib.import_module(cmd).main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["prune", "eval", "generate"])
def test_run_dir_holds_the_files_the_log_and_hydra(cmd, tmp_path, monkeypatch, capsys):
    out = tmp_path / "named"
    code, err = run_cli(cmd, [*ARGS[cmd], f"run_dir={out}", f"cache_dir={tmp_path / 'cache'}"], monkeypatch, capsys)
    assert code == 0, err[-2000:]
    assert (out / RESULT[cmd]).is_file()
    assert (out / f"{cmd}.log").is_file()  # Hydra's job log, named after the script
    assert (out / ".hydra" / "config.yaml").is_file()
    assert f"run_dir: {out}" in (out / ".hydra" / "config.yaml").read_text()
    assert not (tmp_path / "outputs").exists() and not Path("outputs", cmd).joinpath(out.name).exists()


@pytest.mark.parametrize("cmd, old", [("prune", "output_dir"), ("eval", "output_dir"), ("generate", "output_file"),
                                      ("train", "output_dir")])
def test_old_output_keys_are_refused_in_one_line(cmd, old, tmp_path, monkeypatch, capsys):
    def refuse(*_a, **_k):
        raise AssertionError("a model was loaded before the refusal")

    for module in ("spp.models.loading", "spp.eval.runner", "spp.commands.generate"):
        monkeypatch.setattr(importlib.import_module(module), "load_model", refuse)
    code, err = run_cli(cmd, [*ARGS.get(cmd, ["model=tiny"]), f"{old}={tmp_path / 'x'}"], monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{cmd}.py: error: {old}=") and "run_dir=" in lines[0]
    assert "did you mean" not in lines[0]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("cmd", ["train", "prune", "eval", "generate"])
def test_hydra_run_dir_follows_run_dir(cmd, tmp_path):
    register_run_dir_resolver()
    register_eval_resolvers()
    importlib.import_module(f"spp.commands.{cmd}").COMMAND.register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        named = compose(CONFIG_NAME[cmd], overrides=["model=tiny", f"run_dir={tmp_path / 'mine'}"],
                        return_hydra_config=True)
        default = compose(CONFIG_NAME[cmd], overrides=["model=tiny"], return_hydra_config=True)
    assert named.hydra.run.dir == str(tmp_path / "mine")
    # negative control: without run_dir= the command keeps its own outputs/<command>/... name
    assert str(default.hydra.run.dir).startswith(f"outputs/{'eval' if cmd == 'eval' else cmd}/")


@pytest.mark.parametrize("cmd", ["train", "prune", "eval", "generate"])
def test_unwritable_run_dir_is_one_line_before_hydra_creates_it(cmd, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder\n")
    code, err = run_cli(cmd, ["model=tiny", f"run_dir={blocker / 'run'}"], monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{cmd}.py: error: run_dir=") and "Traceback" not in err, err
