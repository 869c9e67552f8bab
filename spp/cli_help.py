"""``--help`` of the commands, rendered from the structured configs by the ``${spp_help:<command>}`` resolver so it
cannot drift from them."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from spp.errors import dataclass_subclasses, field_schema
from spp.eval.job_config import EvalJobConfig
from spp.generation import GenerateJobConfig
from spp.overrides import group_options
from spp.paths import CONF_DIR
from spp.pruning.config import PruneJobConfig
from spp.training.config import TrainJobConfig

WIDTH = 118


@dataclass(frozen=True)
class CommandHelp:
    """What ``--help`` needs of one command: its script, primary config, typed job and curated keys/examples."""

    script: str
    config: str
    job: type
    keys: tuple[tuple[str, str], ...]
    """Important nested keys, each with an example value (description and current value are generated)."""
    commands: tuple[tuple[str, str], ...] = ()
    """Common commands beyond the config file's ``# Use:`` lines: (command, what it does)."""


PRESETS = {
    "experiment": "A whole run preset (global package): model, pruning, adapter and training settings of one recipe.",
    "debug": "Debug preset (global package) applied last: tiny budgets for a seconds-long run.",
    "budget": "A model's compute budget (global package, picked automatically from model=<name>; budget=none "
              "for the paper settings); explicit group options win over it.",
}
"""Descriptions of the groups that have no schema of their own (they set keys of other groups)."""

COMMANDS: dict[str, CommandHelp] = {
    "train": CommandHelp(
        "train.py", "train", TrainJobConfig,
        keys=(("adapter.r", "8"), ("adapter.scale", "2.0"), ("adapter.dropout", "0.0"), ("sparsity.ratio", "0.6"),
              ("trainer.lr", "1e-3"), ("trainer.max_epochs", "3"), ("trainer.max_steps", "100"),
              ("trainer.global_batch_size", "128"), ("trainer.devices", "4"), ("trainer.progress_bar", "log"),
              ("trainer.progress_every_s", "10"), ("trainer.resume_from", "last"), ("data.max_examples", "500"),
              ("data.max_length", "256"), ("eval.tasks", "[spp_zeroshot]"), ("eval.max_windows", "4"),
              ("model.path", "/data/llama-7b"), ("export.merged", "false")),
        commands=(("python train.py experiment=tiny_smoke", "end-to-end smoke run on the tiny random LLaMA (seconds)"),
                  ("python train.py model=tiny debug=fast", "the same budget as a debug preset on any model"),
                  ("python train.py trainer.progress_bar=log", "progress as log lines (automatic when not a TTY)"),
                  ("python train.py print_config=true", "print the config tree (always saved to the run dir)"),
                  ("python -m spp.compare <sweep dir>", "a sweep's table keyed by the keys that differ, and a figure"),
                  ("python train.py --cfg job", "print the composed config and exit")),
    ),
    "evaluate": CommandHelp(
        "eval.py", "evaluate", EvalJobConfig,
        keys=(("model.path", "outputs/train/<run>/merged"), ("eval.tasks", "[spp_zeroshot]"),
              ("eval.seqlen", "512"), ("eval.max_windows", "4"), ("eval.limit", "20"), ("sparsity.ratio", "0.6")),
        commands=(("python eval.py model.path=<run>/merged eval=quick",
                   "evaluate a merged model; the output folder is named from its spp_export.json"),
                  ("python eval.py --cfg job", "print the composed config and exit")),
    ),
    "prune": CommandHelp(
        "prune.py", "prune", PruneJobConfig,
        keys=(("model.path", "/data/llama-7b"), ("sparsity.ratio", "0.6"), ("calibration.nsamples", "32"),
              ("calibration.seqlen", "512")),
        commands=(("python -m spp.pruning.cache list", "what the pruning and perplexity caches hold"),
                  ("python prune.py --cfg job", "print the composed config and exit")),
    ),
    "generate": CommandHelp(
        "generate.py", "generate", GenerateJobConfig,
        keys=(("model.path", "outputs/train/<run>/merged"),),
        commands=(("python generate.py --cfg job", "print the composed config and exit"),),
    ),
}


def attribute_docs(cls: type) -> dict[str, str]:
    """The ``Attributes:`` entries of a dataclass docstring and of its bases' (a class's own entry wins),
    ``{name: text}`` (continuation lines joined)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        out.update(_own_attribute_docs(klass.__doc__ or ""))
    return out


def _own_attribute_docs(text: str) -> dict[str, str]:
    """The ``Attributes:`` entries of one docstring."""
    out: dict[str, str] = {}
    section = False
    current: str | None = None
    for line in inspect.cleandoc(text).splitlines():
        match = re.match(r"^ {4}(\w+)(?: \([^)]*\))?: ?(.*)$", line)
        if line.strip() == "Attributes:":
            section, current = True, None
        elif section and line and not line.startswith(" "):  # the next section (or prose) ends the block
            section = False
        elif section and match:
            current = match.group(1)
            out[current] = match.group(2).strip()
        elif section and current and line.strip():
            out[current] += " " + line.strip()
    return out


def summary(cls: type) -> str:
    """The first paragraph of a class docstring, on one line."""
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n")[0].split())


SENTENCE_END = re.compile(r"(?<!Eq)(?<!e\.g)(?<!i\.e)(?<!Sec)\.(?=\s+[A-Z0-9(`*]|\s*$)")


def first_sentence(text: str, at_least: int = 0) -> str:
    """Up to the first sentence end (more sentences until ``at_least`` characters), RST back-quotes dropped."""
    text = " ".join(text.replace("``", "").split())
    end = 0
    for match in SENTENCE_END.finditer(text):
        end = match.end()
        if end >= at_least:
            return text[:end]
    return text


def key_doc(job: type, key: str) -> str:
    """The docstring entry of a dotted key (``trainer.lr``) of the job dataclass (``KeyError`` when absent)."""
    cls: type | None = job
    *parents, leaf = key.split(".")
    for part in parents:
        cls = field_schema(cls, part) if cls is not None else None
    if cls is None or leaf not in {f.name for f in dataclasses.fields(cls)}:
        raise KeyError(f"{key} is not a key of {job.__name__}")
    return attribute_docs(cls).get(leaf, "")


def groups_of(config: str) -> list[str]:
    """The config groups the primary config ``conf/<config>.yaml`` composes, in its ``defaults`` order."""
    defaults = yaml.safe_load((CONF_DIR / f"{config}.yaml").read_text()).get("defaults", [])
    names = [next(iter(entry)).removeprefix("optional ").strip() for entry in defaults if isinstance(entry, dict)]
    return [name for name in names if not name.startswith(("override ", "hydra/"))]


def option_rows(job: type, root: DictConfig) -> list[tuple[str, str, str]]:
    """``(key, doc, "")`` for every key a chosen group option adds to its group's schema (``pruner=sparsegpt``:
    ``pruner.blocksize``, ``pruner.percdamp``; a plug-in pruner's own keys), from the composed node's type."""
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(job):
        declared = field_schema(job, f.name)
        node = OmegaConf.select(root, f.name, throw_on_resolution_failure=False) if declared else None
        own = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        if declared is None or not (isinstance(own, type) and issubclass(own, declared) and own is not declared):
            continue
        shared = {g.name for g in dataclasses.fields(declared)}
        docs = attribute_docs(own)
        rows += [(f"{f.name}.{g.name}", docs.get(g.name, ""), "") for g in dataclasses.fields(own)
                 if g.name not in shared]
    return rows


def key_rows(job: type, curated: tuple[tuple[str, str], ...],
             option: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The curated keys with their examples, then the chosen options' other keys. A curated key of one option
    (``adapter.r`` of ``adapter=spp``) is shown while that option is chosen; a key no schema declares raises."""
    mine = {key: doc for key, doc, _ in option}
    rows = []
    for key, example in curated:
        if key in mine:
            rows.append((key, mine.pop(key), example))
        elif not _option_key(job, key):
            rows.append((key, key_doc(job, key), example))  # KeyError for a key of no schema
    return rows + [(key, doc, "") for key, doc in mine.items()]


def _option_key(job: type, key: str) -> bool:
    """Whether ``key`` (``adapter.r``) is a field of a subclass of its group's schema (an option's own key)."""
    group, _, leaf = key.partition(".")
    declared = field_schema(job, group)
    return declared is not None and any(leaf in {f.name for f in dataclasses.fields(cls)}
                                        for cls in dataclass_subclasses(declared))


def option_line(group: str, option: str) -> str:
    """The first comment sentence of an option file (after ``@package``), its ``Use:`` part dropped."""
    lines = [line.lstrip("# ").strip() for line in _head_comments(CONF_DIR / group / f"{option}.yaml")]
    text = " ".join(t for t in lines if not t.startswith("@package")).split("Use:")[0].strip()
    return first_sentence(text)


def _head_comments(path: Path) -> list[str]:
    """The comment lines at the head of a YAML file (up to its first other line)."""
    return list(itertools.takewhile(lambda line: line.startswith("#"), path.read_text().splitlines()))


def purpose(config: str) -> str:
    """The first comment line of ``conf/<config>.yaml`` without its ``<script>:`` prefix."""
    first = (CONF_DIR / f"{config}.yaml").read_text().splitlines()[0].lstrip("# ").strip()
    return re.sub(r"^[\w.]+\.py: ", "", first)


def use_lines(config: str) -> list[str]:
    """The commands listed after ``# Use:`` at the head of ``conf/<config>.yaml``."""
    out: list[str] = []
    started = False
    for line in _head_comments(CONF_DIR / f"{config}.yaml"):
        body = line[1:].strip()
        if body.startswith("Use:"):
            started, body = True, body.removeprefix("Use:").strip()
        if started and body.startswith("python"):
            out.append(body)
    return out


def _value(root: DictConfig, key: str) -> str:
    try:
        value = OmegaConf.select(root, key, throw_on_missing=False)
    except Exception:  # an interpolation that needs the run (``${now:...}``): show it unresolved
        value = OmegaConf.select(root, key, throw_on_resolution_failure=False)
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return "null" if value is None else str(value)


def _wrap(head: str, text: str, indent: int) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=head, subsequent_indent=" " * indent) or [head.rstrip()]


def render(name: str, root: DictConfig) -> str:
    """The help text of command ``name`` (``train``, ``evaluate``, ``prune``, ``generate``)."""
    cmd = COMMANDS[name]
    job = cmd.job
    found = OmegaConf.select(root, "hydra.runtime.choices", throw_on_resolution_failure=False)
    choices: dict[str, Any] = OmegaConf.to_container(found) if found is not None else {}
    out = [f"{cmd.script}: {purpose(cmd.config)}", "",
           f"Usage: python {cmd.script} [group=option ...] [key=value ...]   (-m / --multirun: a sweep over "
           "comma-separated values)", "", "== Common commands =="]
    examples = [(line, "") for line in use_lines(cmd.config)] + list(cmd.commands)
    width = max(len(c) for c, what in examples if what) + 2
    for command, what in examples:
        out += _wrap(f"  {command:<{width}}", what, width + 2) if what else [f"  {command}"]
    out += ["", "== Config groups (group=option; * = the default) =="]
    for group in groups_of(cmd.config):
        schema = field_schema(job, group)
        desc = summary(schema) if schema is not None else PRESETS.get(group, "")
        out += _wrap(f"  {group:<12} ", first_sentence(desc), 15)
        chosen = str(choices.get(group))
        opts = [("*" if o == chosen else "") + o for o in group_options(group)]
        if schema is None:
            for o in opts:
                out += _wrap(f"{'':15}{o:<34} ", option_line(group, o.lstrip("*")), 50)
        else:
            out += _wrap(" " * 15, ", ".join(opts), 15)
    out += ["", "== Keys (key  value now  what it does; e.g.) =="]
    top = attribute_docs(job)
    rows = [(f.name, top.get(f.name, ""), "") for f in dataclasses.fields(job) if field_schema(job, f.name) is None]
    rows += key_rows(job, cmd.keys, option_rows(job, root))
    for key, doc, example in rows:
        text = first_sentence(doc, at_least=60) + (f" e.g. {key}={example}" if example else "")
        value = _value(root, key)
        value = value if len(value) <= 22 else value[:19] + "..."
        out += _wrap(f"  {key:<27} {value:<22} ", text, 52)
    out += ["", f"Every key of the composed config: python {cmd.script} --cfg job   (Hydra's own flags: --hydra-help)"]
    return "\n".join(out).replace("$", "$$") + "\n"


def register_help() -> None:
    """Register the ``spp_help`` resolver that ``hydra.help.template`` uses (idempotent)."""
    if not OmegaConf.has_resolver("spp_help"):
        OmegaConf.register_new_resolver("spp_help", lambda name, _root_: render(name, _root_))
