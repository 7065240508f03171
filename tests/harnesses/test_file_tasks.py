"""The file task source: every format reads the same items, held-out items are disjoint from
training by content, and each bad file is a named error from the run's own start-up check
(trainer.loop.check, what scripts/train.py runs before Ray starts)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from harnesses.base import normalize_question
from harnesses.tasks.files import FileTaskParams, FileTasks
from trainer.config import compose
from trainer.loop import check

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# Written by datasets 5.2.0 (Dataset.from_list(...).save_to_disk): "What is a + b?" for a, b in 1..8,
# fields problem / solution / level; hf_arith_splits: the same as a DatasetDict (train 40, test 24).
HF_FOLDER = Path(__file__).parent / "data" / "hf_arith"
HF_SPLITS = Path(__file__).parent / "data" / "hf_arith_splits"


def rows(n: int = 40) -> list[dict]:
    return [{"q": f"What is {i} + {i}?", "a": str(2 * i), "level": i % 3} for i in range(n)]


def write(path: Path, items: list[dict]) -> Path:
    """`items` in the format `path`'s suffix names."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in items))
    elif path.suffix == ".json":
        path.write_text(json.dumps(items))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(items[0]) if items else ["q", "a"])
            writer.writeheader()
            writer.writerows(items)
    else:
        pq.write_table(pa.Table.from_pylist(items), path)
    return path


def source(path, eval_size=8, **params) -> FileTasks:
    return FileTasks(
        "t", {"path": str(path), "question_field": "q", "answer_field": "a", **params}, eval_size=eval_size
    )


def train_questions(src: FileTasks) -> set[str]:
    return {normalize_question(src.train_task(i).question) for i in range(len(src))}


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_every_format_reads_the_same_items(tmp_path, suffix):
    src = source(write(tmp_path / f"d{suffix}", rows()), metadata_fields=["level"])
    reference = source(write(tmp_path / "ref.jsonl", rows()), metadata_fields=["level"])
    assert [t.question for t in src.eval_tasks()] == [t.question for t in reference.eval_tasks()]
    assert [src.train_task(i).answer for i in range(32)] == [reference.train_task(i).answer for i in range(32)]
    level = src.train_task(0).metadata["level"]
    assert str(level) == str(reference.train_task(0).metadata["level"])  # CSV fields are text


def test_a_saved_hf_dataset_folder_reads_with_its_field_names():
    src = FileTasks(
        "hf",
        {
            "path": str(HF_FOLDER),
            "question_field": "problem",
            "answer_field": "solution",
            "metadata_fields": ["level"],
            "verifier": "numeric",
        },
        eval_size=8,
    )
    assert len(src) == 64 - 8 and len(src.eval_tasks()) == 8
    task = src.train_task(0)
    a, b = map(int, task.question.removeprefix("What is ").removesuffix("?").split(" + "))
    assert task.answer == str(a + b) and task.metadata == {"level": a % 3}
    assert task.score(f"<answer>{a + b}</answer>") == 1.0


def test_held_out_questions_are_never_trained_on_and_duplicates_collapse(tmp_path):
    items = rows(30) + [{"q": r["q"].upper() + "  ", "a": r["a"], "level": 0} for r in rows(30)]
    src = source(write(tmp_path / "d.jsonl", items), eval_size=10)
    held = {normalize_question(t.question) for t in src.eval_tasks()}
    assert len(held) == 10 and len(src) == 20, "60 rows are 30 questions: 10 held out, 20 to train on"
    assert train_questions(src) == {normalize_question(r["q"]) for r in rows(30)} - held
    assert [t.question for t in source(tmp_path / "d.jsonl", eval_size=10).eval_tasks()] == [
        t.question for t in src.eval_tasks()
    ], "the held-out set is the same every time"
    other = FileTasks(
        "t", {"path": str(tmp_path / "d.jsonl"), "question_field": "q", "answer_field": "a"}, eval_size=10, eval_seed=7
    )
    assert {normalize_question(t.question) for t in other.eval_tasks()} != held


def test_an_eval_file_is_the_held_out_set_and_its_questions_leave_training(tmp_path):
    write(tmp_path / "train.jsonl", rows(40))
    write(tmp_path / "eval.jsonl", rows(40)[30:])  # 10 questions, also in the training file
    src = source(tmp_path / "train.jsonl", eval_size=5, eval_path=str(tmp_path / "eval.jsonl"))
    assert [t.question for t in src.eval_tasks()] == [r["q"] for r in rows(40)[30:35]]
    assert train_questions(src) == {normalize_question(r["q"]) for r in rows(30)}


def test_template_metadata_and_instruction_make_the_prompt(tmp_path):
    src = source(
        write(tmp_path / "d.jsonl", rows()),
        template='Level {level}: {question} {"json": 1}',
        metadata_fields=["level"],
        verifier="numeric",
    )
    task = src.train_task(0)
    assert task.prompt == (
        f'Level {task.metadata["level"]}: {task.question} {{"json": 1}}\n'
        "Give the final answer as <answer>NUMBER</answer>."
    )
    with pytest.raises(ValueError, match=r"placeholder \{grade\} is neither question"):
        source(tmp_path / "d.jsonl", template="{grade}: {question}")


def test_the_preset_states_the_dataclass_defaults():
    preset = yaml.safe_load((ROOT / "conf/task/file.yaml").read_text())["params"]
    defaults = FileTaskParams(path="x")
    assert preset.pop("path") == "examples/sums.jsonl"
    assert {k: getattr(defaults, k) for k in preset} == preset


# ---- each bad file: a named error from the start-up check, before Ray ------------------------


def run_check(tmp_path, path, *overrides):
    cfg = compose(
        "train",
        [
            "experiment=smoke",
            "task=file",
            "task._target_=harnesses.tasks.files.FileTasks",
            "task.name=mine",
            f"task.params.path={path}",
            "task.params.question_field=q",
            "task.params.answer_field=a",
            "task.eval_size=8",
            "eval.size=8",
            f"run_dir={tmp_path / 'run'}",
            *overrides,
        ],
    )
    check(cfg)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"task.params.path='.*nothere.jsonl': no such file"):
        run_check(tmp_path, tmp_path / "nothere.jsonl")


def test_a_missing_field_is_named_with_the_fields_found(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"question": "1+1", "a": "2", "level": 1}] * 3)
    with pytest.raises(
        ValueError,
        match=r"task.params.question_field: .* has no field 'q' in row 0 "
        r"\(fields found: a, level, question\)",
    ):
        run_check(tmp_path, path)
    with pytest.raises(ValueError, match=r"task.params.metadata_fields: .* no field 'grade'"):
        run_check(tmp_path, write(tmp_path / "e.jsonl", rows()), "+task.params.metadata_fields=[grade]")


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_an_empty_file_is_named(tmp_path, suffix):
    path = write(tmp_path / f"d{suffix}", [])
    with pytest.raises(ValueError, match=r"task.params.path=.* holds no rows"):
        run_check(tmp_path, path)


def test_duplicate_only_data_is_named(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"q": "What is 1 + 1?", "a": "2"}, {"q": "what is 1 +  1?", "a": "2"}] * 20)
    with pytest.raises(ValueError, match=r"all 40 rows ask the same question"):
        run_check(tmp_path, path)


def test_too_few_distinct_items_for_the_eval_size_is_named(tmp_path):
    path = write(tmp_path / "d.jsonl", rows(8) * 3)  # 24 rows, 8 questions: 8 held out leave none
    with pytest.raises(
        ValueError,
        match=r"has 8 distinct questions, fewer than the 9 needed \(task.eval_size=8 "
        r"held out, plus one to train on\); lower task.eval_size",
    ):
        run_check(tmp_path, path)
    write(tmp_path / "eval.jsonl", rows(4))
    with pytest.raises(ValueError, match=r"eval.jsonl has 4 distinct questions, fewer than the 8 needed"):
        run_check(tmp_path, write(tmp_path / "t.jsonl", rows()), f"+task.params.eval_path={tmp_path}/eval.jsonl")


def test_conflicting_answers_and_unscorable_gold_answers_are_named(tmp_path):
    path = write(tmp_path / "d.jsonl", rows() + [{"q": "WHAT is 3 + 3?", "a": "7"}])
    with pytest.raises(ValueError, match=r"rows 3 and 40 ask the same question with different gold answers"):
        run_check(tmp_path, path)
    path = write(tmp_path / "e.jsonl", rows() + [{"q": "What is x?", "a": "x"}])
    with pytest.raises(ValueError, match=r"row 40: verifier 'numeric' cannot score against its gold answer"):
        run_check(tmp_path, path, "task.params.verifier=numeric")


def test_a_datasetdict_folder_names_its_splits(tmp_path):
    with pytest.raises(ValueError, match=r"splits \['train', 'test'\]: point task.params.path at one split"):
        run_check(tmp_path, HF_SPLITS)


def test_scripts_train_exits_with_the_error_before_ray_starts(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/train.py",
            "experiment=smoke",
            "task=file",
            "task._target_=harnesses.tasks.files.FileTasks",
            f"task.params.path={tmp_path}/no.jsonl",
            f"run_dir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "config error: task.params.path=" in proc.stderr and "no such file" in proc.stderr
    assert "Ray" not in proc.stdout + proc.stderr, "no Ray instance was started"


def test_data_files_that_broke_the_start_up_check_are_named(tmp_path):
    """rewards review #17: a CSV field over 128 KiB raised `_csv.Error`, JSONL nested 100,000 deep and
    JSON nested 950 deep raised RecursionError: each escaped the start-up check's ValueError."""
    long = write(tmp_path / "long.csv", [{"q": "x" * 140_000, "a": "1", "level": 0}] + rows())
    with pytest.raises(ValueError, match=r"long.csv': cannot read it as csv: field larger than field limit"):
        run_check(tmp_path, long)
    deep_line = tmp_path / "deep.jsonl"
    deep_line.write_text('{"q": "What?", "a": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(ValueError, match=r"deep.jsonl: line 1 nests lists or objects too deeply to read"):
        run_check(tmp_path, deep_line)
    deep = tmp_path / "deep.json"
    for depth, message in (
        (950, r"(the file|item 40) nests lists or objects"),
        (500, "item 40 nests .* more than 100 deep"),
    ):
        deep.write_text(json.dumps(rows())[:-1] + ', {"q": "What?", "a": ' + "[" * depth + "]" * depth + "}]")
        with pytest.raises(ValueError, match=rf"deep.json: {message}"):
            run_check(tmp_path, deep)


@pytest.mark.parametrize("name", ["../outside.arrow", "/etc/outside.arrow", "sub/../../outside.arrow"])
def test_a_saved_dataset_reads_only_files_inside_its_folder(tmp_path, name):
    """rewards review #17: state.json's `_data_files` named `../outside.arrow` or an absolute path, and
    that file was read."""
    folder = tmp_path / "hf"
    folder.mkdir()
    for f in HF_FOLDER.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (tmp_path / "outside.arrow").write_bytes((HF_FOLDER / "data-00000-of-00001.arrow").read_bytes())
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = [{"filename": name}]
    (folder / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match=r"state.json: _data_files names .*the files of a saved dataset lie in its"):
        source(folder, question_field="problem", answer_field="solution")


# ---- the example files: what examples/make_arith.py writes ----------------------------------


@pytest.mark.parametrize(
    "name, args",
    [
        ("arith.jsonl", []),
        ("sums.jsonl", ["--terms", "2", "--max-operand", "20", "--non-negative", "--count", "400"]),
    ],
)
def test_the_example_files_are_what_make_arith_writes(tmp_path, name, args):
    """The docstring's commands rewrite each committed file byte for byte, and every answer is
    the question's value (with --non-negative, never below 0)."""
    out = tmp_path / name
    script = ROOT / "examples" / "make_arith.py"
    subprocess.run([sys.executable, str(script), *args, "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes() == (ROOT / "examples" / name).read_bytes()
    items = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({i["question"] for i in items}) == len(items)
    for item in items:
        expression = item["question"].removeprefix("What is ").removesuffix("?")
        value = eval(expression)  # digits, + and - only: the file is the repo's own
        assert str(value) == item["answer"] and item["terms"] == expression.count(" ") // 2 + 1
        assert value >= 0 or "--non-negative" not in args


def test_make_arith_refuses_more_questions_than_exist():
    from examples.make_arith import make_items

    assert len(make_items(10, 0, terms=(2,), max_operand=2, non_negative=True)) == 10  # 9 sums + 6 differences: 15
    with pytest.raises(ValueError, match="found only 15 distinct questions of this kind, 16 asked"):
        make_items(16, 0, terms=(2,), max_operand=2, non_negative=True)
