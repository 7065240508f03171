"""The trace data model: validation at construction, JSONL round-trip."""

import math

import pytest

from rollout.trace import Sequence, Trace, TraceError, read_jsonl, write_jsonl


def seq(**kw):
    base = dict(prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.5, -1.0],
                agent="solver", policy="main", version=0)
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


@pytest.mark.parametrize("bad, msg", [
    (dict(prompt_ids=[1, -3]), "negative token id"),
    (dict(prompt_ids=[1, 2.5]), "not an int token id"),
    (dict(prompt_ids=[]), "prompt_ids is empty"),
    (dict(version=-1), "version"),
    (dict(finish_reason="eos"), "finish_reason"),
    (dict(agent=""), "agent and policy"),
])
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


def test_jsonl_round_trip(tmp_path):
    traces = [
        Trace(id="a", group="g1", sequences=[seq(), seq(parent=0, reward=0.5)], reward=1.0,
              agent_rewards={"solver": 1.0}, info={"task": "x"}, timings={"duration_s": 1.5}),
        Trace(id="b", group="g1", sequences=[], status="failed", error="boom"),
    ]
    path = tmp_path / "t.jsonl"
    assert write_jsonl(traces, path) == 2
    back = list(read_jsonl(path))
    assert back == traces


def test_read_jsonl_names_bad_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "group": "g", "sequences": []}\n{"id": "b", "group": "g", "sequences": [], "bogus": 1}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: unknown trace fields \['bogus'\]"):
        list(read_jsonl(path))
