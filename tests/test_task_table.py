"""The one table of evaluation tasks (``spp.eval.task_table``): the tables derived from it equal the ones it replaced,
the paper's mean is its seven tasks, an unknown task is one line (never an MMLU subject), and a task added from a
plug-in folder (``docs/architecture.md``, "How to add an evaluation task") is accepted and run by lm-eval, no file of
``spp/`` edited."""

from __future__ import annotations

import json
import math
import os
import re
import sys
import textwrap

import pytest

import spp.plugins as plugins
from spp.errors import UserError
from spp.eval import task_table
from spp.eval.config import EvalConfig
from spp.eval.harness import leaf_tasks, resolve_tasks, task_data_files, zero_shot_mean
from spp.eval.mmlu_tasks import CATEGORIES, MMLU_SUBJECTS
from spp.eval.tables import ACC_NORM_TASKS, PAPER_COLUMNS
from spp.eval.task_table import (
    PAPER_MEAN_TASKS,
    TASK_DIR,
    TASKS,
    EvalTask,
    aliases,
    known_tasks,
    online_names,
    register_task,
)
from spp.paths import REPO_ROOT

SEVEN = ("spp_boolq", "spp_rte", "spp_hellaswag", "spp_winogrande", "spp_arc_easy", "spp_arc_challenge",
         "spp_openbookqa")
FILES = {"spp_boolq": "boolq/val.jsonl", "spp_rte": "rte/val.jsonl",
         "spp_hellaswag": "hellaswag/hellaswag_val_full.txt", "spp_winogrande": "winogrande/winogrande.jsonl",
         "spp_arc_easy": "arc/ARC-Easy-Test.jsonl", "spp_arc_challenge": "arc/ARC-Challenge-Test.jsonl",
         "spp_openbookqa": "openbookqa/test.tsv"}
"""The tables of ``harness.py`` (``ZERO_SHOT_TASKS``, ``DATA_KEY``) and ``local_data.py`` (``LOCAL_FILES``) as they
were before the task table, pinned."""


def test_the_derived_tables_equal_the_ones_they_replaced():
    assert PAPER_MEAN_TASKS == SEVEN
    assert {t: TASKS[t].data_files for t in SEVEN} == {t: (f,) for t, f in FILES.items()}
    for s in MMLU_SUBJECTS:
        assert TASKS[f"spp_mmlu_{s}"].data_files == (f"mmlu/test/{s}_test.csv", f"mmlu/dev/{s}_dev.csv")
    expected = {**{t: t.removeprefix("spp_") for t in SEVEN}, "spp_mmlu": "mmlu",
                **{f"spp_mmlu_{c}": f"mmlu_{c}" for c in CATEGORIES},
                **{f"spp_mmlu_{s}": f"mmlu_{s}" for s in MMLU_SUBJECTS}}
    assert online_names() == expected and list(online_names()) == list(expected)  # ONLINE_NAMES, order included
    assert aliases() == {**{v: k for k, v in expected.items()}, "zeroshot": "spp_zeroshot", "zero_shot": "spp_zeroshot"}
    assert known_tasks() == frozenset([*expected, "spp_zeroshot"]) and len(known_tasks()) == 70
    assert PAPER_COLUMNS == (("spp_boolq", "BoolQ"), ("spp_rte", "RTE"), ("spp_hellaswag", "HellaSwag"),
                             ("spp_winogrande", "WinoGrande"), ("spp_arc_easy", "ARC-e"),
                             ("spp_arc_challenge", "ARC-c"), ("spp_openbookqa", "OBQA"))
    assert ACC_NORM_TASKS == ("spp_hellaswag", "spp_arc_easy", "spp_arc_challenge", "spp_openbookqa")
    assert task_table.include_paths() == [TASK_DIR]


def test_every_row_matches_its_yaml_and_the_group_is_the_paper_mean():
    yamls = {p: p.read_text() for p in TASK_DIR.rglob("*.yaml")}
    for name, task in TASKS.items():
        found = [text for text in yamls.values() if re.search(rf"^task: {name}$", text, re.M)]
        assert len(found) == 1, name
        loader = task.loader if task.kind != "mmlu" else None  # subjects name theirs in the shared template
        assert loader is None or f"custom_dataset: !function {loader}\n" in found[0], name
    group = (TASK_DIR / "spp_zeroshot.yaml").read_text()
    assert re.findall(r"^  - (\w+)$", group, re.M) == list(PAPER_MEAN_TASKS)
    template = (TASK_DIR / "mmlu" / "_spp_mmlu_template_yaml").read_text()
    assert "custom_dataset: !function spp.eval.tasks.local_data.mmlu\n" in template


def test_the_paper_mean_is_exactly_the_seven_tasks():
    metrics = {t: {"acc": 0.1 * (i + 1)} for i, t in enumerate(SEVEN)}
    assert zero_shot_mean(metrics) == pytest.approx(sum(0.1 * (i + 1) for i in range(7)) / 7)
    assert zero_shot_mean({**metrics, "spp_mmlu": {"acc": 1.0}, "spp_other": {"acc": 1.0}}) == zero_shot_mean(metrics)
    assert zero_shot_mean({t: m for t, m in metrics.items() if t != "spp_rte"}) is None
    assert leaf_tasks(["zeroshot"]) == list(SEVEN)


@pytest.mark.parametrize("name", ["boolqq", "spp_mmlu_not_a_subject", "mmlu_foo"])
def test_an_unknown_task_is_one_line_naming_the_known_ones(name):
    for call in (lambda: resolve_tasks([name]), lambda: EvalConfig(tasks=[name]),
                 lambda: task_data_files([name])):
        with pytest.raises(UserError) as err:
            call()
        text = str(err.value)
        assert "\n" not in text and text.startswith(f"unknown eval task {name!r} in eval.tasks; known: spp_zeroshot")
        assert all(t in text for t in SEVEN) and err.value.key == "eval.tasks"


def test_a_plugin_cannot_take_a_name_or_join_the_paper_mean():
    row = EvalTask("spp_x", "x", ("x.jsonl",), "x.load")
    for bad in (EvalTask("spp_boolq", "x", (), "x.load"), EvalTask("spp_x", "boolq", (), "x.load"),
                EvalTask("spp_mmlu_x", "x", (), "x.load"), EvalTask("spp_x", "x", (), "x.load", kind="mmlu"),
                EvalTask("spp_x", "x", (), "x.load", in_paper_mean=True), EvalTask("spp_x", "zeroshot", (), "x.load")):
        with pytest.raises(UserError):
            register_task(bad)
    assert "spp_x" not in TASKS and row not in TASKS.values()


PLUGIN_INIT = '''
"""A dummy yes/no task: its row, its YAML in tasks/, its loader in loader.py."""
from pathlib import Path

from spp.eval.task_table import EvalTask, register_task

register_task(EvalTask(name="spp_dummy_yesno", online_name="dummy_yesno", data_files=("dummy_yesno/val.jsonl",),
                       loader="dummytaskplug.loader.load", title="Dummy", include_path=Path(__file__).parent / "tasks"))
'''
PLUGIN_LOADER = '''
import json

import datasets

from spp.eval.tasks.local_data import sample_order, task_file


def load(**kwargs):
    lines = task_file("spp_dummy_yesno", kwargs).read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(sample_order(rows, kwargs.get("doc_seed")))})
'''
PLUGIN_YAML = '''
task: spp_dummy_yesno
dataset_path: local
custom_dataset: !function dummytaskplug.loader.load
output_type: multiple_choice
validation_split: validation
doc_to_text: "{{question}}\\nAnswer:"
doc_to_target: label
doc_to_choice: ["no", "yes"]
metric_list:
  - metric: acc
metadata:
  version: 1.0
'''


@pytest.fixture
def plugin_task(tmp_path, monkeypatch):
    """A plug-in folder holding one evaluation task, loaded as ``SPP_PLUGINS`` loads it; its data root."""
    folder = tmp_path / "dummytaskplug"
    (folder / "tasks").mkdir(parents=True)
    (folder / "__init__.py").write_text(textwrap.dedent(PLUGIN_INIT))
    (folder / "loader.py").write_text(textwrap.dedent(PLUGIN_LOADER))
    (folder / "tasks" / "spp_dummy_yesno.yaml").write_text(textwrap.dedent(PLUGIN_YAML).lstrip())
    data = tmp_path / "data" / "dummy_yesno"
    data.mkdir(parents=True)
    rows = [{"question": f"Is {i} even?", "label": int(i % 2 == 0)} for i in range(4)]
    (data / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = dict(task_table._TASKS)
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.setenv(plugins.PLUGINS_ENV, str(folder))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert plugins.load_plugins() == ["dummytaskplug"]
    yield tmp_path / "data"
    task_table._TASKS.clear()
    task_table._TASKS.update(before)
    for name in [m for m in sys.modules if m.startswith("dummytaskplug")]:
        del sys.modules[name]


def test_a_task_from_a_plugin_folder_is_accepted_and_run_by_lm_eval(plugin_task):
    from spp.eval.harness import evaluate_tasks
    from spp.models.tiny import tiny_llama, tiny_tokenizer

    row = TASKS["spp_dummy_yesno"]
    assert not row.include_path.is_relative_to(REPO_ROOT / "spp") and not row.in_paper_mean
    assert EvalConfig(tasks=["dummy_yesno", "spp_zeroshot"]).tasks == ["dummy_yesno", "spp_zeroshot"]
    assert resolve_tasks(["dummy_yesno"]) == ["spp_dummy_yesno"] and PAPER_MEAN_TASKS == SEVEN
    assert task_table.include_paths() == [TASK_DIR, row.include_path]
    assert task_data_files(["spp_dummy_yesno"], plugin_task)["spp_dummy_yesno"] == [plugin_task / row.data_files[0]]
    run = evaluate_tasks(tiny_llama(seed=0), tiny_tokenizer(), ["dummy_yesno"], data_dir=plugin_task)
    acc = run.metrics["spp_dummy_yesno"]["acc"]
    assert math.isfinite(acc) and 0.0 <= acc <= 1.0 and run.metrics["spp_dummy_yesno"]["n"] == 4
    assert run.zero_shot_mean is None and os.environ[plugins.PLUGINS_ENV].endswith("dummytaskplug")
