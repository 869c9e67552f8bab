"""Adds the ``conf/`` folder of every plug-in named in ``SPP_PLUGINS`` to Hydra's config search path
(``spp.plugins``): a plug-in's ``pruner/<name>.yaml``, ``adapter/<name>.yaml`` or ``objective/<name>.yaml`` then
composes like the project's own. Hydra finds ``SearchPathPlugin`` s in the ``hydra_plugins`` namespace package."""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class SppPluginsSearchPath(SearchPathPlugin):
    """Appends ``file://<plug-in>/conf`` for each plug-in folder (after the project's ``conf/``)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from spp.plugins import plugin_conf_dirs

        for conf in plugin_conf_dirs():
            search_path.append(provider=f"spp-plugin-{conf.parent.name}", path=f"file://{conf}")
