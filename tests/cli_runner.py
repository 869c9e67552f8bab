"""Command lines run one after another in one subprocess (torch imported once), with the weight loaders replaced
by a tripwire: a refusal that came after loading weights fails (the CLI refusal tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MARK = "@@case-done"
RUNNER = f"""
import json, runpy, sys, traceback
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
    print(f"{MARK} {{name}} {{code}}", file=sys.stderr, flush=True)
"""
"""Runs each ``(name, [script, *args])`` of ``argv[1]`` (JSON) as ``python script args``; after each, one
``@@case-done <name> <exit status>`` line on stderr closes that case's output."""


def run_cases(cases: dict[str, list[str]], env: dict[str, str], cwd: Path,
              timeout: int) -> tuple[subprocess.CompletedProcess, dict[str, tuple[object, str]]]:
    """Run ``cases`` through :data:`RUNNER`; returns the process and ``{case: (exit status, its stderr)}``."""
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(list(cases.items()))], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    found: dict[str, tuple[object, str]] = {}
    lines: list[str] = []
    for line in proc.stderr.splitlines():
        if line.startswith(MARK):
            _, name, code = line.split()
            found[name] = (int(code) if code.lstrip("-").isdigit() else code, "\n".join(lines))
            lines = []
        else:
            lines.append(line)
    return proc, found
