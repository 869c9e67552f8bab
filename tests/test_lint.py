"""The repository is ruff clean: CI's last step, checked in the default suite so a lint error fails minutes earlier."""

import shutil
import subprocess

import pytest

from spp.paths import REPO_ROOT


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff comes with the dev extra")
def test_ruff_finds_nothing() -> None:
    done = subprocess.run(["ruff", "check", "--output-format", "concise", "."], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
