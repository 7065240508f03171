"""Tasks from a data file the user brings, scored by a verifier named in the config.

    python scripts/train.py task=file task.params.path=examples/sums.jsonl task.params.verifier=numeric

`FileTasks` reads the rows of `task.params.path` (JSONL, JSON, CSV, Parquet or a
saved HF dataset: harnesses/tasks/data_files.py); each row gives a question
(`question_field`), a gold answer (`answer_field`) and metadata fields the
verifier receives. Rows that ask the same question (case and white space aside)
collapse into one item. The held-out set is `task.eval_size` of these items drawn
with `task.eval_seed` (or the first `eval_size` of `task.params.eval_path`'s), and
no item whose question is held out is ever trained on. Training item `i` is item
`i % size` of the rest, shuffled with the run's seed; `task.size` caps how many.
Every problem with the data (no file, a missing field, no rows, only duplicates,
too few items for the held-out set, a gold answer the verifier cannot read) is a
ValueError when the source is built, which validate() does before Ray starts.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from harnesses.base import TaskSource, normalize_question
from harnesses.tasks.data_files import read_rows
from harnesses.verifiers.base import Verifier
from harnesses.verifiers.registry import make_verifier

P = "task.params"


@dataclass
class FileTaskParams:
    """`task.params` of a file task source."""

    path: str  # the data file (or saved HF dataset folder)
    question_field: str = "question"  # the field holding the question
    answer_field: str | None = "answer"  # the field holding the gold answer (None: items have none)
    metadata_fields: list[str] = field(default_factory=list)  # fields passed to the verifier (and the template)
    template: str | None = None  # the question as sent, e.g. "Q: {question}" (placeholders: question, metadata fields)
    eval_path: str | None = None  # a file of held-out items (same fields); None: held out from `path`
    format: str = "auto"  # jsonl | json | csv | parquet | hf; auto: by suffix (a folder: hf)
    verifier: str = "exact"  # exact | numeric | math | regex | choice | judge | package.module:function
    verifier_options: dict[str, Any] = field(
        default_factory=dict
    )  # the verifier's fields (harnesses/verifiers/registry.py)
    shuffle: bool = True  # training order shuffled with the run's seed (else file order)


@dataclass
class FileTask:
    """One item of a data file (a `harnesses.base.Task`)."""

    id: str
    question: str
    prompt: str
    answer: str | None
    metadata: dict[str, Any]
    verifier: Verifier

    def score(self, text: str):
        """A float, or an awaitable one for the LLM judge (harnesses/base.py: Task.score)."""
        return self.verifier.score(text, self.answer, self.metadata, question=self.question)


@dataclass(frozen=True)
class _Item:
    row: int  # where it is in its file (0-based)
    question: str
    answer: str | None
    metadata: dict[str, Any]


class FileTasks(TaskSource):
    """Training and held-out tasks from the rows of a data file (see the module docstring)."""

    def setup(self) -> None:
        self.options = _params(self.params)
        self.verifier = make_verifier(self.options.verifier, self.options.verifier_options)
        if self.verifier.needs_answer and self.options.answer_field is None:
            raise ValueError(
                f"{P}.verifier={self.options.verifier!r} compares with a gold answer: set "
                f"{P}.answer_field to the field that holds it"
            )
        self._check_template()
        items = self._load(self.options.path, "path")
        held, excluded = self._held_out(items, self.eval_size, self.eval_seed)
        train = [i for i in items if normalize_question(i.question) not in excluded]
        if not train:
            raise ValueError(
                f"every question of {P}.path={self.options.path!r} is in {P}.eval_path: nothing is left to train on"
            )
        if self.options.shuffle:
            random.Random(self.seed).shuffle(train)
        self._train, self._held = train[: self.size], held
        self.size = len(self._train)

    def _held_out(self, items: list[_Item], eval_size: int, eval_seed: int) -> tuple[list[_Item], set[str]]:
        """The held-out items, and the questions no training item may ask: the held-out ones, or
        every question of the eval file."""
        if self.options.eval_path is None:
            _enough(
                items, self.options.path, eval_size + 1, f"task.eval_size={eval_size} held out, plus one to train on"
            )
            held = random.Random(eval_seed).sample(items, eval_size)
            return held, {normalize_question(i.question) for i in held}
        eval_items = self._load(self.options.eval_path, "eval_path")
        _enough(eval_items, self.options.eval_path, eval_size, f"task.eval_size={eval_size}")
        return eval_items[:eval_size], {normalize_question(i.question) for i in eval_items}

    def default_instruction(self) -> str:
        return self.verifier.instruction

    def scoring_roles(self) -> list[str]:
        return self.verifier.roles()

    def __repr__(self) -> str:
        return f"FileTasks({self.name!r}, path={self.options.path!r}, size={self.size}, eval_size={self.eval_size})"

    def draw(self, split: str, index: int, task_id: str) -> FileTask:
        item = (self._train if split == "train" else self._held)[index]
        prompt = self._render(item)
        return FileTask(
            id=task_id,
            question=item.question,
            answer=item.answer,
            metadata=dict(item.metadata),
            prompt=f"{prompt}\n{self.instruction}" if self.instruction else prompt,
            verifier=self.verifier,
        )

    # ---- reading the rows into distinct, checked items ----------------------------------

    def _load(self, path: str, key: str) -> list[_Item]:
        rows = read_rows(path, self.options.format, f"{P}.{key}")
        o = self.options
        wanted = [o.question_field] + ([o.answer_field] if o.answer_field is not None else []) + o.metadata_fields
        for number, row in enumerate(rows):
            missing = [f for f in wanted if f not in row]
            if missing:
                what = next(
                    k
                    for k in ("question_field", "answer_field", "metadata_fields")
                    if missing[0] in _as_list(getattr(o, k))
                )
                raise ValueError(
                    f"{P}.{what}: {path} has no field {missing[0]!r} in row {number} (fields found: "
                    f"{', '.join(sorted(row))}); name one of those in {P}.{what}"
                )
        return self._distinct([self._item(number, row, path) for number, row in enumerate(rows)], path)

    def _item(self, number: int, row: dict[str, Any], path: str) -> _Item:
        question = row[self.options.question_field]
        if not isinstance(question, str) or not question.strip():
            raise ValueError(
                f"{path} row {number}: the question ({P}.question_field="
                f"{self.options.question_field!r}) is {question!r}, not a non-empty text"
            )
        answer = None if self.options.answer_field is None else row[self.options.answer_field]
        if answer is not None:
            answer = (
                answer
                if isinstance(answer, str)
                else json.dumps(answer)
                if isinstance(answer, (dict, list))
                else str(answer)
            )
        if self.verifier.needs_answer:
            if answer is None:
                raise ValueError(
                    f"{path} row {number}: the gold answer ({P}.answer_field="
                    f"{self.options.answer_field!r}) is missing (null)"
                )
            try:
                self.verifier.check_gold(answer)
            except ValueError as e:
                raise ValueError(
                    f"{path} row {number}: verifier {self.options.verifier!r} cannot score against its gold answer: {e}"
                ) from None
        return _Item(number, question, answer, {k: row[k] for k in self.options.metadata_fields})

    @staticmethod
    def _distinct(items: list[_Item], path: str) -> list[_Item]:
        """One item per question; the same question with two gold answers is a data error."""
        seen: dict[str, _Item] = {}
        for item in items:
            first = seen.setdefault(normalize_question(item.question), item)
            if first.answer != item.answer:
                raise ValueError(
                    f"{path}: rows {first.row} and {item.row} ask the same question with different "
                    f"gold answers ({first.answer!r}, {item.answer!r}); keep one of them"
                )
        if len(seen) == 1 and len(items) > 1:
            raise ValueError(
                f"{path}: all {len(items)} rows ask the same question ({items[0].question[:60]!r}; "
                f"case and white space do not count): there is one item, nothing to learn from"
            )
        return list(seen.values())

    # ---- the question as sent ------------------------------------------------------------

    def _check_template(self) -> None:
        template = self.options.template
        if template is None:
            return
        names = set(_PLACEHOLDER.findall(template))
        if "question" not in names:
            raise ValueError(f"{P}.template={template!r} has no {{question}} placeholder")
        unknown = sorted(names - {"question", *self.options.metadata_fields})
        if unknown:
            raise ValueError(
                f"{P}.template: placeholder {{{unknown[0]}}} is neither question nor one of "
                f"{P}.metadata_fields={self.options.metadata_fields}"
            )

    def _render(self, item: _Item) -> str:
        if self.options.template is None:
            return item.question
        values = {"question": item.question, **item.metadata}
        # Only known names are replaced: other braces in the template (e.g. JSON) stay as written.
        return _PLACEHOLDER.sub(lambda m: str(values[m[1]]) if m[1] in values else m[0], self.options.template)


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _enough(items: list[_Item], path: str, need: int, why: str) -> None:
    if len(items) < need:
        raise ValueError(
            f"{path} has {len(items)} distinct questions, fewer than the {need} needed ({why}); "
            f"lower task.eval_size (and eval.size) or bring more items"
        )


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _params(params: dict[str, Any]) -> FileTaskParams:
    """`task.params` as FileTaskParams; ValueError naming an unknown or missing key."""
    known = {f.name for f in dataclasses.fields(FileTaskParams)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"{P}.{unknown[0]} is not a parameter of the file task source (its parameters: {', '.join(sorted(known))})"
        )
    if not params.get("path"):
        raise ValueError(f"{P}.path is not set: give the data file, e.g. {P}.path=examples/sums.jsonl")
    fields = {
        k: (dict(v) if k == "verifier_options" else list(v) if k == "metadata_fields" else v) for k, v in params.items()
    }
    return FileTaskParams(**fields)
