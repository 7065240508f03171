"""The trace viewer's rendering (rollout/viewer.py) on hand-built traces with the tiny tokenizer."""

import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from rollout.trace import Sequence, Trace
from rollout.viewer import GENERATED, MASKED, PROMPT, build_view, load_decode, render_page, render_sequence

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def decode(tiny_path):
    return load_decode(tiny_path)


@pytest.fixture(scope="module")
def enc(tiny_tokenizer):
    return lambda text: tiny_tokenizer.encode(text, add_special_tokens=False)


def seq(prompt, completion, agent="solver", policy="main", trainable=True, parent=None, version=0):
    return Sequence(
        prompt, completion, [-0.5] * len(completion), agent, policy, version, trainable=trainable, parent=parent
    )


@pytest.fixture(scope="module")
def chat(enc):
    """A solver conversation of two turns (#0, #2 continues #0), a verifier in a fresh context (#1)
    and a frozen judge that continues the verifier (#3)."""
    p0 = enc("<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n")
    c0 = enc("It is 7.<|im_end|>")
    p1 = enc("<|im_start|>user\nIs 7 right for 3 + 4?<|im_end|>\n<|im_start|>assistant\n")
    c1 = enc("yes because 3 plus 4<|im_end|>")
    p2 = p0 + c0 + enc("\n<|im_start|>user\nA reviewer wrote: yes. Final answer?<|im_end|>\n<|im_start|>assistant\n")
    c2 = enc("<answer>7</answer><|im_end|>")
    p3 = p1 + c1 + enc("\n<|im_start|>user\nJudge it.<|im_end|>\n<|im_start|>assistant\n")
    c3 = enc("correct<|im_end|>")
    return Trace(
        "chat-0",
        "chain_sum/3",
        [
            seq(p0, c0, version=2),
            seq(p1, c1, agent="verifier"),
            seq(p2, c2, parent=0, version=3),
            seq(p3, c3, agent="judge", policy="frozen", trainable=False, parent=1),
        ],
        reward=1.0,
        agent_rewards={"solver": 1.0, "verifier": 0.5, "judge": -1.0},
        info={"answer": "7", "note": "<b>bold</b> & co"},
    )


def test_spans_mark_prompt_generated_and_masked_tokens(chat, decode):
    view = build_view(chat, decode)
    kinds = [[sp.kind for sp in s.spans] for s in view.sequences]
    assert kinds == [[PROMPT, GENERATED], [PROMPT, GENERATED], [PROMPT, GENERATED], [PROMPT, MASKED]]
    assert view.sequences[0].spans[1].text == "It is 7.<|im_end|>"  # special tokens kept
    assert [s.version for s in view.sequences] == [2, 0, 3, 0]
    assert [s.trained for s in view.sequences] == [True, True, True, False]

    page = render_page([view], "t")
    for kind in (PROMPT, GENERATED, MASKED):
        assert f'class="tok {kind}"' in page, kind
    # the legend explains every class
    assert all(re.search(rf'class="legend">.*class="tok {k}"', page, re.S) for k in (PROMPT, GENERATED, MASKED))
    assert re.search(r"\.tv \.masked\{background:[^}]+\}", page)


def test_failed_trace_masks_every_generated_token(chat, decode):
    failed = Trace(**{**chat.to_dict(), "status": "failed", "error": "RuntimeError: boom"})
    view = build_view(failed, decode)
    assert all(s.spans[-1].kind == MASKED for s in view.sequences)
    assert view.rows == [] and all(s.row is None for s in view.sequences)
    page = render_page([view], "t")
    assert page.count('class="tok generated"') == 1  # the legend's
    assert "RuntimeError: boom" in page and "failed trace: not trained" in page


def test_merge_rows_follow_exact_prefix_chains(chat, enc, decode):
    """#2 continues #0 (one row), the verifier is a fresh context (own row), the frozen judge
    makes no row; a continuation whose prompt rewrote history stands alone."""
    view = build_view(chat, decode)
    assert view.rows == [[0, 2], [1]]
    assert [s.row for s in view.sequences] == [0, 1, 0, None]
    page = render_page([view], "t")
    assert "row 1 (#0 → #2)" in page and "row 2</span>" in page and "frozen: not trained" in page

    compact = Trace(
        "compact", "g", [chat.sequences[0], seq(enc("<|im_start|>user\nSummary: 7.<|im_end|>\n"), enc("ok"), parent=0)]
    )
    cview = build_view(compact, decode)
    assert cview.rows == [[0], [1]]
    assert cview.sequences[1].hidden_tokens == 0 and "shown whole" in cview.sequences[1].note


def test_continuation_shows_only_the_new_prompt(chat, decode):
    view = build_view(chat, decode)
    s2 = view.sequences[2]
    parent = chat.sequences[0]
    assert s2.hidden_tokens == parent.num_tokens
    assert s2.spans[0].num_tokens == len(chat.sequences[2].prompt_ids) - parent.num_tokens
    assert s2.spans[0].text.startswith("\n<|im_start|>user\nA reviewer wrote")
    assert "What is 3 + 4?" not in s2.spans[0].text
    page = render_page([view], "t")
    assert f"⋯ {parent.num_tokens} tokens: #0's prompt + completion" in page
    assert page.count("What is 3 + 4?") == 1  # the solver's question, on #0's card only


def test_text_is_escaped(chat, enc, decode):
    evil = "<script>alert(1)</script>"
    t = Trace(
        "<img src=x onerror=alert(1)>",
        "g\"'",
        [seq(enc(evil), enc("</pre><b>x</b>"))],
        status="failed",
        error="<iframe src=//evil>",
        info={"k<": evil},
    )
    page = render_page([build_view(t, decode), build_view(chat, decode)], "<title>")
    assert "<script" not in page and "<img" not in page and "<iframe" not in page and "</pre><b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in page  # info values
    assert "<title>&lt;title&gt;</title>" in page


def test_sequence_card_is_self_contained(chat, decode):
    """The wandb table cell: one card, with its CSS, and nothing external."""
    view = build_view(chat, decode)
    cell = render_sequence(view, 3)
    assert cell.startswith("<style>") and 'class="tok masked"' in cell and "frozen: not trained" in cell
    assert "<html" not in cell and "http" not in cell


def test_module_imports_no_ray_vllm_or_torch(tiny_path):
    code = (
        "import sys; import rollout.viewer as v; v.load_decode(sys.argv[1])([1, 2]); "
        "print(sorted(m for m in ('ray', 'vllm', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, tiny_path], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_two_trainable_policies_show_their_policy_and_version(chat, decode):
    """Solver on `main` v3, verifier on its own trainable policy `critic` v1: each card names its
    policy and version, and both are trained (only the frozen judge is masked)."""
    seqs = list(chat.sequences)
    seqs[1] = msgspec.structs.replace(seqs[1], policy="critic", version=1)
    view = build_view(msgspec.structs.replace(chat, sequences=seqs), decode)
    assert [(s.policy, s.version, s.trained) for s in view.sequences] == [
        ("main", 2, True),
        ("critic", 1, True),
        ("main", 3, True),
        ("frozen", 0, False),
    ]
    assert "policy <b>critic</b> v1" in render_sequence(view, 1)
    assert "policy <b>main</b> v3" in render_sequence(view, 2)
