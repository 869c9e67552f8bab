"""Command lines run one after another in one subprocess (torch imported once), with the weight loaders replaced
by a tripwire: a refusal that came after loading weights fails (the CLI refusal tests)."""

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
