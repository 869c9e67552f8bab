"""Thin re-export: the benchmark variants live in ``lab.bench.variants`` (importable without ``sys.path`` edits).

Add new variant functions there; every public name of that module is re-exported here.
"""

from lab.bench.variants import *  # noqa: F401,F403
