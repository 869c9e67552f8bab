"""A cache or output directory that cannot be written is named in one line by the preflight,
before any model is loaded (it used to be an ``OSError`` traceback after the load and the dense perplexity).

Two ways to make a directory unwritable: a path below a regular file (no one, root included, can create it), and
a read-only (0555) directory. Root ignores permission bits, so as root the second case makes the write probe
itself fail with ``EACCES``, the error a non-root user gets from the real directory.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from spp import atomic
from spp.paths import CONF_DIR, SAMPLE_DATA_DIR

FAST = 20.0
ARGS = {
    "train": ["model=tiny", "debug=fast", f"data_dir={SAMPLE_DATA_DIR}", "print_config=false"],
    "prune": ["model=tiny", "pruner=magnitude", "sparsity=nm2_4"],
    "eval": ["model=tiny", "pruner=magnitude", "sparsity=nm2_4", "eval.seqlen=64", "eval.max_windows=2",
             f"data_dir={SAMPLE_DATA_DIR}"],
}
OUTPUT_KEY = {"train": "run_dir", "prune": "run_dir", "eval": "run_dir"}


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if any command loads a model."""

    def refuse(*_a, **_k):
        raise AssertionError("a model was loaded before the error")

    # Import every module before patching any: a module first imported while ``spp.models.loading`` is patched
    # would bind ``refuse`` with ``from ... import``, and monkeypatch would "restore" it to ``refuse``.
    modules = {name: importlib.import_module(name) for name in
               ("spp.models.loading", "spp.eval.runner", "spp.pruning.job", "spp.training.callbacks.pruning")}
    for name in ("spp.models.loading", "spp.eval.runner"):  # load_for_rank goes through the first
        monkeypatch.setattr(modules[name], "load_model", refuse)
    for name in ("spp.models.loading", "spp.pruning.job", "spp.training.callbacks.pruning"):
        monkeypatch.setattr(modules[name], "load_for_rank", refuse)


def run_cli(cmd: str, args: list[str], tmp_path: Path, monkeypatch, capsys, cache: Path, out: Path) -> tuple[int, str]:
    """``<cmd>.py args`` in process with the given cache and output directories; (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", [f"{cmd}.py", f"--config-path={CONF_DIR}", *args, f"cache_dir={cache}",
                                      f"{OUTPUT_KEY[cmd]}={out}", f"hydra.run.dir={tmp_path / 'hydra'}",
                                      "hydra.output_subdir=null"])
    capsys.readouterr()
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(cmd).main()
    assert time.perf_counter() - start < FAST
    return exc.value.code, capsys.readouterr().err


def one_line(err: str, cmd: str, *names: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{cmd}.py: error: ") and " — " in lines[0], lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def read_only(directory: Path, monkeypatch) -> Path:
    """Make ``directory`` read-only (0555); as root, where that does not stop writes, make writes in it fail."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o555)
    if os.geteuid() == 0:
        real = tempfile.mkstemp

        def refused(*args, **kwargs):
            target = Path(kwargs.get("dir") or args[2]).resolve()
            if target == directory.resolve() or directory.resolve() in target.parents:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target))
            return real(*args, **kwargs)

        monkeypatch.setattr(atomic.tempfile, "mkstemp", refused)
        monkeypatch.setattr(Path, "mkdir", _refuse_mkdir_under(directory, Path.mkdir))
    return directory


def _refuse_mkdir_under(directory: Path, real):
    def mkdir(self, *args, **kwargs):
        if directory.resolve() in self.resolve().parents and not self.exists():
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self, *args, **kwargs)

    return mkdir


@pytest.mark.parametrize("cmd", ["train", "prune", "eval"])
def test_cache_dir_below_a_file(cmd, tmp_path, monkeypatch, capsys, no_weights):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file\n")
    code, err = run_cli(cmd, ARGS[cmd], tmp_path, monkeypatch, capsys, blocker / "cache", tmp_path / "out")
    assert code == 2
    one_line(err, cmd, "cache_dir=", str(blocker / "cache"), "SPP_CACHE_DIR")


@pytest.mark.parametrize("cmd", ["train", "prune", "eval"])
def test_read_only_cache_dir(cmd, tmp_path, monkeypatch, capsys, no_weights):
    cache = read_only(tmp_path / "cache", monkeypatch)
    try:
        code, err = run_cli(cmd, ARGS[cmd], tmp_path, monkeypatch, capsys, cache, tmp_path / "out")
    finally:
        cache.chmod(0o755)
    assert code == 2
    one_line(err, cmd, "cache_dir=", str(cache), "Permission denied")


@pytest.mark.parametrize("cmd", ["train", "prune", "eval"])
def test_run_dir_below_a_file(cmd, tmp_path, monkeypatch, capsys, no_weights):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file\n")
    code, err = run_cli(cmd, ARGS[cmd], tmp_path, monkeypatch, capsys, tmp_path / "cache", blocker / "run")
    assert code == 2
    one_line(err, cmd, f"{OUTPUT_KEY[cmd]}=", str(blocker / "run"))


def test_read_only_run_dir(tmp_path, monkeypatch, capsys, no_weights):
    run = read_only(tmp_path / "run", monkeypatch)
    try:
        code, err = run_cli("train", ARGS["train"], tmp_path, monkeypatch, capsys, tmp_path / "cache", run)
    finally:
        run.chmod(0o755)
    assert code == 2
    one_line(err, "train", "run_dir=", "Permission denied")


def test_writable_dirs_are_created_and_left_clean(tmp_path):
    target = atomic.check_writable_dir(tmp_path / "a" / "b", "cache_dir")
    assert target.is_dir() and not list(target.iterdir())
