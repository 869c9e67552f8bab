"""``SPP_PLUGINS``: a user's plug-in folders are imported once before Hydra composes, and their ``conf/`` is on
Hydra's search path (``hydra_plugins/spp_plugins``); a bad folder is one line."""

from __future__ import annotations

import os
import sys

import pytest

import spp.plugins as plugins
from spp.errors import UserError


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.setattr(plugins, "_loaded", {})
    yield monkeypatch
    for name in [m for m in sys.modules if m.startswith("myplug")]:
        del sys.modules[name]


def test_a_plugin_folder_is_imported_once_and_its_conf_found(tmp_path, clean):
    folder = tmp_path / "myplug_a"
    (folder / "conf" / "pruner").mkdir(parents=True)
    (folder / "__init__.py").write_text("import builtins\n"
                                        "builtins.MYPLUG_IMPORTS = getattr(builtins, 'MYPLUG_IMPORTS', 0) + 1\n")
    clean.setenv(plugins.PLUGINS_ENV, f"{folder}{os.pathsep}")
    import builtins

    builtins.MYPLUG_IMPORTS = 0
    assert plugins.load_plugins() == ["myplug_a"] and plugins.load_plugins() == ["myplug_a"]
    assert builtins.MYPLUG_IMPORTS == 1
    assert plugins.plugin_conf_dirs() == [(folder / "conf").resolve()]


def test_hydra_searches_the_plugin_conf(tmp_path, clean):
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    folder = tmp_path / "myplug_b"
    (folder / "conf").mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    clean.setenv(plugins.PLUGINS_ENV, str(folder))
    found = [p for p in Plugins.instance().discover(SearchPathPlugin) if p.__name__ == "SppPluginsSearchPath"]
    assert found, "hydra_plugins/spp_plugins is not discovered"
    search = ConfigSearchPathImpl()
    found[0]().manipulate_search_path(search)
    assert [e.path for e in search.get_path()] == [f"file://{(folder / 'conf').resolve()}"]


@pytest.mark.parametrize("make", ["missing", "no_init"])
def test_a_bad_plugin_folder_is_one_line(tmp_path, clean, make):
    folder = tmp_path / "myplug_c"
    if make == "no_init":
        folder.mkdir()
    clean.setenv(plugins.PLUGINS_ENV, str(folder))
    with pytest.raises(UserError, match="is not a plug-in folder") as err:
        plugins.load_plugins()
    assert err.value.key == plugins.PLUGINS_ENV and "\n" not in str(err.value)


def test_a_plugin_object_unpickles_in_a_fresh_process(tmp_path, clean):
    """submitit (hydra/launcher=local|slurm) pickles the job, plug-in classes included, and unpickles it in a fresh
    process that never ran ``load_plugins``: the plug-in's module must import there from ``SPP_PLUGINS`` alone."""
    import pickle
    import subprocess

    folder = tmp_path / "myplug_pickled"
    folder.mkdir()
    (folder / "__init__.py").write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass Setting:\n"
                                        "    keep: int = 3\n")
    clean.setenv(plugins.PLUGINS_ENV, str(folder))
    assert plugins.load_plugins() == ["myplug_pickled"]
    setting = sys.modules[f"{plugins.NAMESPACE}.myplug_pickled"].Setting(keep=5)
    code = "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).keep)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(setting), capture_output=True, env=env,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.decode().strip() == "5", proc.stderr.decode()[-2000:]
    env.pop(plugins.PLUGINS_ENV)  # negative control: without SPP_PLUGINS the fresh process cannot find it
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(setting), capture_output=True, env=env,
                          timeout=120)
    assert proc.returncode != 0 and b"myplug_pickled" in proc.stderr
