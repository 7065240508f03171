"""The trace data model: validation at construction and from files (every field type-checked,
every rejection a TraceError naming the field), JSONL round-trip."""

import json
import math

import pytest

from rollout.trace import Sequence, Trace, TraceError, read_jsonl, write_jsonl

pytestmark = pytest.mark.unit


def seq(**kw):
    base = dict(
        prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.5, -1.0], agent="solver", policy="main", version=0
    )
    return Sequence(**{**base, **kw})


def test_valid_sequence_counts():
    s = seq()
    assert s.num_tokens == 5
    t = Trace(id="t", group="g", sequences=[s, seq(agent="verifier", trainable=False, parent=0)])
    assert t.agents == ["solver", "verifier"]
    assert t.num_generated_tokens == 4 and t.num_trainable_tokens == 2


def test_logprobs_length_mismatch_rejected():
    with pytest.raises(TraceError, match="logprobs has 1 entries but completion_ids has 2"):
        seq(logprobs=[-0.5])


def test_nan_logprob_rejected():
    with pytest.raises(TraceError, match=r"logprobs\[1\] = nan"):
        seq(logprobs=[-0.5, math.nan])


def test_positive_logprob_rejected():
    with pytest.raises(TraceError, match="not a finite log-probability"):
        seq(logprobs=[-0.5, 0.7])


def test_out_of_vocab_token_rejected():
    s = seq(completion_ids=[4, 600])
    s.check_vocab(601)  # in range
    with pytest.raises(TraceError, match=r"completion_ids\[1\] = 600 is out of vocabulary \(vocab_size 512\)"):
        s.check_vocab(512)
    t = Trace(id="t", group="g", sequences=[seq(), s])
    with pytest.raises(TraceError, match=r"sequences\[1\] \(solver/main\)"):
        t.check_vocab({"main": 512})


@pytest.mark.parametrize(
    "bad, msg",
    [
        (dict(prompt_ids=[1, -3]), "negative token id"),
        (dict(prompt_ids=[1, 2.5]), "not an int token id"),
        (dict(prompt_ids=[]), "prompt_ids is empty"),
        (dict(version=-1), "version"),
        (dict(finish_reason="eos"), "finish_reason"),
        (dict(agent=""), "agent = '' must be a non-empty string"),
        (dict(policy=None), "policy = None must be a non-empty string"),
        (dict(trainable=1), "trainable = 1 must be a bool"),
        (dict(parent=0.0), "parent = 0.0 must be an int"),
        (dict(parent=True), "parent = True must be an int"),
        (dict(version=True), "version = True must be a non-negative int"),
        (dict(completion_ids=[4, True]), r"completion_ids\[1\] = True is not an int token id"),
        (dict(logprobs=[-0.5, "-1"]), "logprobs = .* must be a list of float"),
        (dict(reward="1"), "reward = '1' must be a number"),
    ],
)
def test_bad_sequence_fields_rejected(bad, msg):
    with pytest.raises(TraceError, match=msg):
        seq(**bad)


def test_bad_trace_fields_rejected():
    with pytest.raises(TraceError, match="must say why"):
        Trace(id="t", group="g", sequences=[], status="failed")
    with pytest.raises(TraceError, match="status"):
        Trace(id="t", group="g", sequences=[], status="weird")
    with pytest.raises(TraceError, match="reward = nan"):
        Trace(id="t", group="g", sequences=[seq()], reward=math.nan)
    with pytest.raises(TraceError, match="role 'judge'"):
        Trace(id="t", group="g", sequences=[seq()], agent_rewards={"judge": 1.0})
    with pytest.raises(TraceError, match="parent = 1"):
        Trace(id="t", group="g", sequences=[seq(parent=1)])


@pytest.mark.parametrize(
    "bad, msg",
    [
        (dict(id=""), "id = '' must be a non-empty string"),
        (dict(group=7), "group = 7 must be a non-empty string"),
        (dict(reward=True), "reward = True must be a number"),
        (dict(info=[("task", 1)]), "info = .* must be a dict with string keys"),
        (dict(info={1: "x"}), "info = .* must be a dict with string keys"),
        (dict(timings={"duration_s": "fast"}), r"timings\['duration_s'\] = 'fast' must be a number"),
        (dict(agent_rewards=[1.0]), "agent_rewards = .* must be a dict"),
        (dict(agent_rewards={"solver": "1"}), r"agent_rewards\['solver'\] = '1' must be a number"),
        (dict(error=RuntimeError("x"), status="failed"), "error = .* must be a string"),
    ],
)
def test_bad_trace_field_types_rejected(bad, msg):
    with pytest.raises(TraceError, match=msg):
        Trace(**{"id": "t", "group": "g", "sequences": [seq()], **bad})


GOOD = {
    "id": "a",
    "group": "g",
    "sequences": [
        {
            "prompt_ids": [1, 2],
            "completion_ids": [3],
            "logprobs": [-0.1],
            "agent": "solver",
            "policy": "main",
            "version": 0,
        }
    ],
}


@pytest.mark.parametrize(
    "field, value, msg",
    [
        ("sequences.0.trainable", 1, r"Expected `bool`, got `int` - at `\$.sequences\[0\].trainable`"),
        ("sequences.0.prompt_ids", [1, 2.0], r"Expected `int`, got `float` - at `\$.sequences\[0\].prompt_ids\[1\]`"),
        ("sequences.0.parent", "0", r"Expected `int \| null`, got `str` - at `\$.sequences\[0\].parent`"),
        ("sequences.0.agent", "", r"agent = '' must be a non-empty string - at `\$.sequences\[0\]`"),
        ("sequences.0.logprobs", [0.5], r"logprobs\[0\] = 0.5 is not a finite log-probability"),
        ("info", [1], r"Expected `object`, got `array` - at `\$.info`"),
        ("timings", {"start": "now"}, r"Expected `float`, got `str` - at `\$.timings"),
        ("agent_rewards", {"solver": True}, r"Expected `float`, got `bool` - at `\$.agent_rewards"),
        ("id", 3, r"Expected `str`, got `int` - at `\$.id`"),
        ("bogus", 1, "Object contains unknown field `bogus`"),
    ],
)
def test_malformed_fields_in_a_file_are_named_with_the_line(tmp_path, field, value, msg):
    bad = json.loads(json.dumps(GOOD))
    *path, last = field.split(".")
    node = bad
    for key in path:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    file = tmp_path / "t.jsonl"
    file.write_text(json.dumps(GOOD) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=rf"t.jsonl:2: {msg}"):
        list(read_jsonl(file))
    with pytest.raises(TraceError, match=rf"trace: {msg}"):  # the same checks for dicts (buffer.put)
        Trace.from_dict(bad)


def test_jsonl_round_trip(tmp_path):
    traces = [
        Trace(
            id="a",
            group="g1",
            sequences=[seq(), seq(parent=0, reward=0.5)],
            reward=1.0,
            agent_rewards={"solver": 1.0},
            info={"task": "x"},
            timings={"duration_s": 1.5},
        ),
        Trace(id="b", group="g1", sequences=[], status="failed", error="boom"),
    ]
    path = tmp_path / "t.jsonl"
    assert write_jsonl(traces, path) == 2
    back = list(read_jsonl(path))
    assert back == traces


def test_read_jsonl_names_bad_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"id": "a", "group": "g", "sequences": []}\n{"id": "b", "group": "g", "sequences": [], "bogus": 1}\n'
    )
    with pytest.raises(TraceError, match=r"t.jsonl:2: Object contains unknown field `bogus`"):
        list(read_jsonl(path))


def test_a_trace_file_is_replaced_whole_or_not_at_all(tmp_path):
    """write_jsonl writes beside the file and renames over it: a writer that dies mid-file (here its
    traces raise half-way) leaves the file as it was, never torn, and nothing beside it."""
    path = tmp_path / "rollouts" / "step_1.jsonl"
    old = [Trace(id=f"t#{k}", group="t", sequences=[]) for k in range(3)]
    assert write_jsonl(old, path) == 3

    def dying():
        yield Trace(id="new#0", group="new", sequences=[])
        raise KeyboardInterrupt("the driver was killed mid-write")

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(dying(), path)
    assert [t.id for t in read_jsonl(path)] == ["t#0", "t#1", "t#2"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["step_1.jsonl"]
