"""The offline lm-eval task definitions: local files load, document counts, prompts equal lm-eval's own."""

from __future__ import annotations

import csv
import importlib.util
import json
import random

import pytest

from spp.eval.harness import leaf_tasks, resolve_tasks, task_data_files, task_manager
from spp.eval.mmlu_tasks import MMLU_SUBJECTS, MMLU_TASK_DIR, render_mmlu_yamls
from spp.eval.task_table import PAPER_MEAN_TASKS, TASK_DIR
from spp.eval.tasks import local_data
from spp.paths import SAMPLE_DATA_DIR, SHARED_DATA_DIR

# Documents in the samples shipped in data/ (data/README.md): a seeded random 200 (BoolQ, HellaSwag, WinoGrande,
# ARC), all 277 RTE, all 500 OpenBookQA, a seeded random 10 test rows per MMLU subject.
SAMPLE_DOCS = {
    "spp_boolq": 200,
    "spp_rte": 277,
    "spp_hellaswag": 200,
    "spp_winogrande": 200,
    "spp_arc_easy": 200,
    "spp_arc_challenge": 200,
    "spp_openbookqa": 500,
}


@pytest.fixture(scope="module")
def loaded(sample_data_dir):
    tm = task_manager(sample_data_dir)
    return tm.load(["spp_zeroshot", "spp_mmlu"])["tasks"]


def _task(loaded, name):
    return next(t for key, t in loaded.items() if str(key).split(":")[-1] == name or getattr(t, "task_name", None)
                == name or t.config.task == name)


def test_every_task_loads_its_local_file_with_the_documented_count(loaded):
    for name, count in SAMPLE_DOCS.items():
        assert len(list(_task(loaded, name).eval_docs)) == count, name
    mmlu = [t for t in loaded.values() if t.config.task.startswith("spp_mmlu_")]
    assert len(mmlu) == 57
    for task in mmlu:
        assert len(list(task.eval_docs)) == 10
        assert len(list(task.fewshot_docs())) == 5
        assert task.config.num_fewshot == 5


def test_prompts_match_lm_eval_templates(loaded, sample_data_dir):
    first = json.loads((sample_data_dir / "boolq/val.jsonl").open().readline())
    boolq = _task(loaded, "spp_boolq")
    doc = next(iter(boolq.eval_docs))
    assert boolq.doc_to_text(doc) == f"{first['passage']}\nQuestion: {first['question']}?\nAnswer:"
    assert boolq.doc_to_choice(doc) == ["no", "yes"]
    assert boolq.doc_to_target(doc) == {"false": 0, "true": 1}[first["label"]]

    rte_raw = json.loads((sample_data_dir / "rte/val.jsonl").open().readline())
    rte = _task(loaded, "spp_rte")
    doc = next(iter(rte.eval_docs))
    assert rte.doc_to_text(doc) == f"{rte_raw['premise']}\nQuestion: {rte_raw['hypothesis']} True or False?\nAnswer:"
    assert rte.doc_to_target(doc) == (0 if rte_raw["label"] == "entailment" else 1)

    wino_raw = json.loads((sample_data_dir / "winogrande/winogrande.jsonl").open().readline())
    wino = _task(loaded, "spp_winogrande")
    doc = next(iter(wino.eval_docs))
    assert wino.doc_to_choice(doc) == wino_raw["context_options"]
    assert wino.doc_to_text(doc) == wino_raw["gold"] and wino.doc_to_target(doc) == wino_raw["continuation"]

    mmlu = _task(loaded, "spp_mmlu_anatomy")
    with (sample_data_dir / "mmlu/test/anatomy_test.csv").open(newline="") as fh:
        q, a, b, c, d, ans = next(csv.reader(fh))
    doc = next(iter(mmlu.eval_docs))
    assert mmlu.doc_to_text(doc) == f"{q.strip()}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer:"
    assert mmlu.doc_to_target(doc) == "ABCD".index(ans)
    assert mmlu.config.description == "The following are multiple choice questions (with answers) about anatomy.\n\n"


def test_boolq_labels_follow_the_local_strings(sample_data_dir):
    raw = [json.loads(line)["label"] for line in (sample_data_dir / "boolq/val.jsonl").open()]
    labels = local_data.boolq(data_dir=str(sample_data_dir))["validation"]["label"]
    assert labels == [1 if x == "true" else 0 for x in raw] and 0 < sum(labels) < len(labels)


@pytest.mark.parametrize("task, loader, bad, accepted", [
    ("rte/val.jsonl", local_data.rte, "not entailment", "entailment, not_entailment"),
    ("rte/val.jsonl", local_data.rte, "contradiction", "entailment, not_entailment"),
    ("boolq/val.jsonl", local_data.boolq, "maybe", "false, true"),
])
def test_a_label_outside_the_task_labels_is_one_line_naming_file_row_and_labels(sample_data_dir, tmp_path, task,
                                                                                  loader, bad, accepted):
    lines = (sample_data_dir / task).read_text().splitlines()
    (tmp_path / task).parent.mkdir(parents=True)
    (tmp_path / task).write_text("\n".join(lines) + "\n")
    good = loader(data_dir=str(tmp_path))["validation"]  # negative control: the shipped rows pass
    assert len(good) == len(lines) and set(good["label"]) == {0, 1}
    row = json.loads(lines[3])
    (tmp_path / task).write_text("\n".join([*lines[:3], json.dumps({**row, "label": bad}), *lines[4:]]) + "\n")
    with pytest.raises(ValueError) as err:
        loader(data_dir=str(tmp_path))
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / task) in message and "row 4 " in message, message  # line 4
    assert repr(bad) in message and message.endswith(f"use one of: {accepted}"), message


def test_hellaswag_text_form_and_capitalisation(sample_data_dir):
    docs = local_data.hellaswag(data_dir=str(sample_data_dir))["validation"]
    assert docs[0]["query"] == "High jump: A boy is running down a track. The boy"  # task 3 of the full file
    assert docs[0]["label"] == 2 and len(docs[0]["choices"]) == 4
    assert all("[" not in e for d in docs for e in [d["query"], *d["choices"]])
    assert local_data.capitalize_last_fragment("Label: Done. the man") == "Label: Done. The man"
    assert local_data.hellaswag_preprocess("How to x [title] Do y. [step] Now") == "How to x. Do y. Now"


def test_arc_numeric_answer_keys_resolve_by_label(sample_data_dir, tmp_path):
    row = {"id": "x", "question": {"stem": "Q?", "choices": [{"text": t, "label": str(i + 1)}
                                                            for i, t in enumerate("abcd")]}, "answerKey": "3"}
    (tmp_path / "arc").mkdir()
    (tmp_path / "arc/ARC-Easy-Test.jsonl").write_text(json.dumps(row) + "\n")
    doc = local_data.arc_easy(data_dir=str(tmp_path))["test"][0]
    assert doc["choices"]["label"].index(doc["answerKey"]) == 2 and doc["choices"]["text"][2] == "c"


def test_openbookqa_tsv_equals_parsed_jsonl_copy(sample_data_dir):
    docs = local_data.openbookqa(data_dir=str(sample_data_dir))["test"]
    parsed = [json.loads(line) for line in (sample_data_dir / "openbookqa/openbook_qa.jsonl").open()]
    assert len(docs) == len(parsed) == 500
    for doc, ref in zip(docs, parsed, strict=True):
        assert doc["question_stem"] == ref["query"] and doc["choices"]["text"] == ref["choices"]
        assert "ABCD".index(doc["answerKey"]) == ref["gold"]
    with pytest.raises(ValueError, match="OpenBookQA choices field"):
        local_data.parse_obqa_choices("(A) x (B) y")


def test_generated_mmlu_yamls_are_up_to_date():
    rendered = render_mmlu_yamls()
    on_disk = {p.name: p.read_text() for p in MMLU_TASK_DIR.iterdir() if p.is_file()}
    assert on_disk == rendered
    assert len(MMLU_SUBJECTS) == 57 and sum(n.startswith("spp_mmlu_") for n in rendered) == 57
    assert len(rendered) == 57 + 4 + 1 + 1  # subjects, categories, the spp_mmlu group, the template
    assert (TASK_DIR / "spp_zeroshot.yaml").is_file()


def test_task_names_and_unknown_task():
    resolved = resolve_tasks(["boolq", "spp_rte", "zeroshot", "mmlu"])
    assert resolved == ["spp_boolq", "spp_rte", "spp_zeroshot", "spp_mmlu"]
    assert leaf_tasks(["spp_zeroshot"]) == list(PAPER_MEAN_TASKS)
    assert len(leaf_tasks(["spp_mmlu"])) == 57
    assert len(leaf_tasks(["spp_mmlu_humanities"])) == 13
    with pytest.raises(ValueError, match="unknown eval task 'boolqq' in eval.tasks"):
        resolve_tasks(["boolqq"])


def test_missing_data_file_is_named(tmp_path, monkeypatch):
    import spp.paths

    monkeypatch.setattr(spp.paths, "SAMPLE_DATA_DIR", tmp_path / "no-samples")
    monkeypatch.setattr(spp.paths, "SHARED_DATA_DIR", tmp_path / "no-shared")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"eval task spp_boolq: data file 'boolq/val.jsonl' not found"):
        task_data_files(["spp_boolq"], tmp_path / "empty")


def test_doc_seed_gives_a_seeded_random_order_that_limit_takes_a_prefix_of(sample_data_dir):
    """eval.limit takes a seeded random sample (same seed -> same documents), MMLU dev never moves."""
    plain = local_data.boolq(data_dir=str(sample_data_dir))["validation"]["idx"]
    a = local_data.boolq(data_dir=str(sample_data_dir), doc_seed=0)["validation"]["idx"]
    b = local_data.boolq(data_dir=str(sample_data_dir), doc_seed=0)["validation"]["idx"]
    c = local_data.boolq(data_dir=str(sample_data_dir), doc_seed=1)["validation"]["idx"]
    assert plain == list(range(200)) and sorted(a) == plain and a == b and a != c and a[:20] != plain[:20]
    expected = list(range(200))
    random.Random(0).shuffle(expected)
    assert a == expected
    m0 = local_data.mmlu(subject="anatomy", data_dir=str(sample_data_dir))
    m1 = local_data.mmlu(subject="anatomy", data_dir=str(sample_data_dir), doc_seed=3)
    assert m0["dev"]["question"] == m1["dev"]["question"]
    assert sorted(m0["test"]["question"]) == sorted(m1["test"]["question"]) != m1["test"]["question"]


FULL_RECORDS = {"boolq/val.jsonl": 3270, "winogrande/winogrande.jsonl": 1267, "arc/ARC-Easy-Test.jsonl": 2376,
                "arc/ARC-Challenge-Test.jsonl": 1172, "hellaswag/hellaswag_val_full.txt": 10042}
"""Records of the full-size files the samples were drawn from (data/README.md)."""


def _make_samples():
    spec = importlib.util.spec_from_file_location("make_samples", SAMPLE_DATA_DIR / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_samples_are_seeded_random_records_of_the_full_files(sample_data_dir):
    """data/make_samples.py: 200 whole records of the full copy, in file order, not its first 200 — checked on the
    shipped files alone: BoolQ's records carry their line number in the full file (``idx``), which must be exactly
    the seeded draw; every sampled file splits into whole records only, as many as drawn."""
    make = _make_samples()
    readers = {"jsonl": make.jsonl_records, "hellaswag": make.hellaswag_records}
    for rel, (kind, k) in make.SAMPLES.items():
        text = (sample_data_dir / rel).read_bytes().decode("utf-8")
        records = readers[kind](text)
        assert len(records) == k == 200 and "".join(records) == text, rel
        _, drawn = make.sample(list(range(FULL_RECORDS[rel])), k, rel)
        assert drawn == sorted(set(drawn)) and drawn != list(range(k)) and drawn[-1] < FULL_RECORDS[rel], rel
    _, boolq_draw = make.sample(list(range(FULL_RECORDS["boolq/val.jsonl"])), 200, "boolq/val.jsonl")
    idx = [json.loads(line)["idx"] for line in (sample_data_dir / "boolq/val.jsonl").open()]
    assert idx == boolq_draw
    for path in sorted((sample_data_dir / "mmlu/test").glob("*_test.csv")):
        text = path.read_bytes().decode("utf-8")
        assert len(make.csv_records(text)) == make.MMLU_PER_SUBJECT and "".join(make.csv_records(text)) == text
    if (SHARED_DATA_DIR / "boolq/val.jsonl").is_file():  # the project's machines: byte-identical to the full copy
        for rel in make.SAMPLES:
            full = readers[make.SAMPLES[rel][0]]((SHARED_DATA_DIR / rel).read_bytes().decode("utf-8"))
            picked, _ = make.sample(full, 200, rel)
            assert "".join(picked).encode() == (sample_data_dir / rel).read_bytes(), rel


def test_a_task_file_is_found_where_the_preflight_found_it(tmp_path, monkeypatch):
    """With ``$SPP_DATA_DIR`` lacking a task's file, the check before loading finds the shipped sample: lm-eval's
    loader reads that same file (it searched ``$SPP_DATA_DIR`` alone, failing after the model was loaded)."""
    monkeypatch.setenv("SPP_DATA_DIR", str(tmp_path))
    checked = task_data_files(["spp_boolq"])["spp_boolq"]
    assert checked[0].is_relative_to(SAMPLE_DATA_DIR)
    assert [local_data.task_file("spp_boolq", {})] == checked
    with pytest.raises(FileNotFoundError):  # an explicit data_dir is searched alone, by both
        local_data.task_file("spp_boolq", {"data_dir": str(tmp_path)})
