"""The trace viewer: a Trace as display data, and that as one self-contained HTML page.

`build_view(trace, decode)` decodes every sequence into spans of prompt tokens,
generated tokens the learner trains on, and masked generated tokens it does not
(frozen roles, failed traces), and works out the training rows the way
trainer/packing.py merges them (`rollout.trace.prefix_chains`). `render_page`
turns views into HTML with inline CSS, no script and no external resources;
`render_sequence` is one sequence's card, for a cell of the wandb trace table.
scripts/view_traces.py writes the page for a traces.jsonl.

No ray / vllm / torch here: the viewer runs wherever a traces file is.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rollout.trace import Trace, prefix_chains

Decode = Callable[[list[int]], str]  # token ids -> text
PROMPT, GENERATED, MASKED = "prompt", "generated", "masked"  # span kinds, also CSS classes
_AGENT_COLOURS = 8  # CSS classes a0..a7


@dataclass
class Span:
    kind: str  # prompt | generated | masked
    text: str
    num_tokens: int


@dataclass
class SequenceView:
    index: int  # position in the trace
    agent: str
    policy: str
    version: int  # weight version of the policy when the request was submitted
    finish_reason: str
    trainable: bool  # the sequence's own flag (False: a frozen role)
    trained: bool  # whether its tokens carry loss (trainable, generated something, trace not failed)
    parent: int | None
    reward: float | None  # per-turn reward, if the harness gave one
    row: int | None  # index into TraceView.rows; None when not trained
    prompt_tokens: int
    hidden_tokens: int  # leading prompt tokens not shown: the parent's prompt + completion
    spans: list[Span]
    note: str = ""  # anything odd, said in words


@dataclass
class TraceView:
    id: str
    group: str
    status: str
    error: str | None
    reward: float
    agent_rewards: dict[str, float] | None
    info: dict
    duration_s: float | None
    sequences: list[SequenceView]
    rows: list[list[int]]  # training rows: exact-prefix chains of trained sequence indices

    @property
    def agents(self) -> list[str]:
        return sorted({s.agent for s in self.sequences})


def load_decode(model_path: str | Path) -> Decode:
    """A decode function for a local HF model folder that keeps special tokens (the chat markup)."""
    path = Path(model_path)
    if (path / "tokenizer.json").exists():  # the `tokenizers` library alone: no torch import
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(path / "tokenizer.json"))
        return lambda ids: fast.decode(ids, skip_special_tokens=False)
    from transformers import AutoTokenizer  # slow (sentencepiece-only) tokenizers

    slow = AutoTokenizer.from_pretrained(path)
    return lambda ids: slow.decode(ids, skip_special_tokens=False)


def build_view(trace: Trace, decode: Decode) -> TraceView:
    """Decode a trace into display data: spans per sequence, training rows, rewards."""
    trained = trace.trained_mask()
    rows = prefix_chains(trace.sequences, [i for i, t in enumerate(trained) if t])
    row_of = {i: r for r, chain in enumerate(rows) for i in chain}
    seqs = []
    for i, s in enumerate(trace.sequences):
        hidden, note = 0, ""
        if s.parent is not None:
            p = trace.sequences[s.parent]
            n = p.num_tokens
            if s.prompt_ids[:n] == p.prompt_ids + p.completion_ids:
                hidden = n
            else:
                note = (
                    f"parent #{s.parent}, but this prompt does not start with #{s.parent}'s "
                    f"prompt + completion exactly: shown whole"
                )
        spans = [Span(PROMPT, decode(s.prompt_ids[hidden:]), len(s.prompt_ids) - hidden)]
        if s.completion_ids:
            kind = GENERATED if trained[i] else MASKED
            spans.append(Span(kind, decode(s.completion_ids), len(s.completion_ids)))
        seqs.append(
            SequenceView(
                i,
                s.agent,
                s.policy,
                s.version,
                s.finish_reason,
                s.trainable,
                trained[i],
                s.parent,
                s.reward,
                row_of.get(i),
                len(s.prompt_ids),
                hidden,
                spans,
                note,
            )
        )
    return TraceView(
        trace.id,
        trace.group,
        trace.status,
        trace.error,
        trace.reward,
        trace.agent_rewards,
        dict(trace.info),
        trace.timings.get("duration_s"),
        seqs,
        rows,
    )


# ------------------------------------------------------------------ HTML
CSS = """
.tv{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1f2328;
  max-width:1180px;margin:0 auto;padding:12px 20px}
.tv h1{font-size:20px;margin:4px 0 8px}.tv h2{font-size:16px;margin:0;display:inline}
.tv .muted{color:#656d76}
.tv code,.tv .mono{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:12.5px}
.tv .legend{display:flex;flex-wrap:wrap;gap:6px 18px;margin:8px 0 4px;font-size:13px}
.tv .legend span.tok{margin-right:5px}
.tv .notes{font-size:13px;color:#444c56;margin:4px 0 14px;padding-left:18px}
.tv table{border-collapse:collapse;font-size:13px}
.tv th,.tv td{text-align:left;padding:2px 10px 2px 0;vertical-align:top}
.tv th{color:#656d76;font-weight:600}
.tv .trace{border:1px solid #d0d7de;border-radius:8px;margin:18px 0;padding:10px 14px;background:#fff}
.tv .trace>summary{cursor:pointer;list-style-position:outside}
.tv .facts{display:flex;flex-wrap:wrap;gap:4px 16px;margin:8px 0;font-size:13px}
.tv .badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;font-weight:600;
  background:#eaeef2;color:#24292f;white-space:nowrap}
.tv .st-ok{background:#dafbe1;color:#116329}.tv .st-truncated{background:#fff1c2;color:#7d4e00}
.tv .st-failed{background:#ffd8d3;color:#a40e26}
.tv .error{background:#fff0ee;border:1px solid #ffc1b8;color:#82071e;border-radius:6px;padding:6px 9px;
  white-space:pre-wrap;margin:6px 0}
.tv .rows{margin:8px 0;font-size:13px;display:flex;flex-wrap:wrap;gap:4px 14px}
.tv .seq{border:1px solid #d0d7de;border-left:5px solid var(--agent);border-radius:6px;margin:10px 0;
  padding:6px 10px 8px;background:#fff}
.tv .seq-head{display:flex;flex-wrap:wrap;align-items:center;gap:4px 10px;font-size:13px;margin-bottom:5px}
.tv .agent{background:var(--agent);color:#fff}
.tv .text{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:12.5px;line-height:1.6;
  white-space:pre-wrap;word-break:break-word;margin:0}
.tv .tok{padding:1px 0;border-radius:3px;-webkit-box-decoration-break:clone;box-decoration-break:clone}
.tv .prompt{background:#e8ecf0;color:#3d444d}
.tv .generated{background:#c6f0cf;color:#0b3d1a;box-shadow:inset 0 -2px 0 #2da44e}
.tv .masked{background:repeating-linear-gradient(135deg,#ffe3c4 0 6px,#fcd3a6 6px 12px);color:#6b2c00;
  box-shadow:inset 0 -2px 0 #d1600a}
.tv .hidden{display:inline-block;color:#656d76;font-style:italic;border:1px dashed #8c959f;border-radius:4px;
  padding:0 6px;margin:0 0 3px;font-family:system-ui,sans-serif;font-size:12px}
.tv .special{opacity:.55}
.tv .note{color:#9a6700;font-size:12px;margin:3px 0}
.tv .a0{--agent:#0969da}.tv .a1{--agent:#8250df}.tv .a2{--agent:#bf3989}.tv .a3{--agent:#1a7f37}
.tv .a4{--agent:#bc4c00}.tv .a5{--agent:#0a7a8f}.tv .a6{--agent:#6e7781}.tv .a7{--agent:#953800}
"""

LEGEND = (
    f'<div class="legend"><span><span class="tok {PROMPT}">&nbsp;prompt&nbsp;</span>context the model read'
    f'</span><span><span class="tok {GENERATED}">&nbsp;generated&nbsp;</span>sampled, trained on</span>'
    f'<span><span class="tok {MASKED}">&nbsp;masked&nbsp;</span>sampled, not trained (frozen role or '
    f'failed trace)</span><span><span class="hidden">⋯ parent</span> earlier turns not repeated</span></div>'
)

NOTES = (
    "<ul class='notes'><li>A continuation (<code>parent</code> set) shows only the new part of its prompt: "
    "the tokens before it are its parent's prompt + completion, shown on the parent's card.</li>"
    "<li>Rows are the training rows of <code>trainer/packing.py</code> (merge on): a sequence whose prompt "
    "extends an earlier one of the same policy exactly joins its row. Rows the trainer skips for a zero "
    "advantage are not marked.</li></ul>"
)

_SPECIAL = re.compile(r"&lt;\|[\w.-]{1,40}\|&gt;")  # ChatML-style markup, after escaping


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _text(s: str) -> str:
    return _SPECIAL.sub(lambda m: f'<span class="special">{m.group(0)}</span>', _esc(s))


def _json(x) -> str:
    return json.dumps(x, ensure_ascii=False, default=str)


def _num(x: float) -> str:
    return f"{x:.4g}"


def _colours(views: list[TraceView]) -> dict[str, str]:
    """Agent -> CSS class; same colour for an agent everywhere on the page."""
    agents = sorted({a for v in views for a in v.agents})
    return {a: f"a{k % _AGENT_COLOURS}" for k, a in enumerate(agents)}


def _row_label(view: TraceView, r: int) -> str:
    chain = view.rows[r]
    merged = " → ".join(f"#{i}" for i in chain)
    return f"row {r + 1}" + (f" ({merged})" if len(chain) > 1 else "")


def _sequence_card(view: TraceView, s: SequenceView, colours: dict[str, str]) -> str:
    generated = sum(sp.num_tokens for sp in s.spans if sp.kind != PROMPT)
    head = [
        f"<b>#{s.index}</b>",
        f'<span class="badge agent">{_esc(s.agent)}</span>',
        f"<span>policy <b>{_esc(s.policy)}</b> v{s.version}</span>",
        f'<span class="muted">finish</span> {_esc(s.finish_reason)}',
        f'<span class="muted">{s.prompt_tokens} prompt'
        f"{f' ({s.prompt_tokens - s.hidden_tokens} new)' if s.hidden_tokens else ''} + {generated} generated "
        f"tokens</span>",
    ]
    if s.parent is not None:
        head.append(f"<span>continues #{s.parent}</span>")
    if s.row is not None:
        head.append(f'<span class="badge">{_esc(_row_label(view, s.row))}</span>')
    elif not s.trainable:
        head.append('<span class="badge">frozen: not trained</span>')
    elif view.status == "failed":
        head.append('<span class="badge st-failed">failed trace: not trained</span>')
    elif not generated:
        head.append('<span class="badge">nothing generated</span>')
    if s.reward is not None:
        head.append(f"<span>turn reward <b>{_num(s.reward)}</b></span>")
    body = []
    if s.hidden_tokens:
        body.append(f'<span class="hidden">⋯ {s.hidden_tokens} tokens: #{s.parent}\'s prompt + completion</span>\n')
    for sp in s.spans:
        body.append(f'<span class="tok {sp.kind}" title="{sp.kind}: {sp.num_tokens} tokens">{_text(sp.text)}</span>')
    note = f'<div class="note">{_esc(s.note)}</div>' if s.note else ""
    return (
        f'<div class="seq {colours.get(s.agent, "a0")}">'
        f'<div class="seq-head">{" ".join(head)}</div>{note}<pre class="text">{"".join(body)}</pre></div>'
    )


def _trace_section(view: TraceView, anchor: str, colours: dict[str, str]) -> str:
    facts = [f"<span>group <code>{_esc(view.group)}</code></span>", f"<span>reward <b>{_num(view.reward)}</b></span>"]
    for agent, r in sorted((view.agent_rewards or {}).items()):
        facts.append(
            f'<span><span class="badge agent {colours.get(agent, "a0")}">{_esc(agent)}</span> '
            f"reward <b>{_num(r)}</b></span>"
        )
    if view.duration_s is not None:
        facts.append(f'<span class="muted">{view.duration_s:.2f} s</span>')
    agent_rows = []
    for agent in view.agents:
        mine = [s for s in view.sequences if s.agent == agent]
        gen = sum(sp.num_tokens for s in mine for sp in s.spans if sp.kind != PROMPT)
        trained = sum(sp.num_tokens for s in mine for sp in s.spans if sp.kind == GENERATED)
        agent_rows.append(
            f'<tr><td><span class="badge agent {colours.get(agent, "a0")}">{_esc(agent)}</span>'
            f"</td><td>{', '.join(f'#{s.index}' for s in mine)}</td><td>"
            f"{_esc(', '.join(sorted({s.policy for s in mine})))}</td><td>{gen}</td>"
            f"<td>{trained}</td></tr>"
        )
    agents = (
        "<table><tr><th>agent</th><th>sequences</th><th>policy</th><th>generated</th>"
        f"<th>trained</th></tr>{''.join(agent_rows)}</table>"
    )
    rows = ['<span class="muted">training rows</span>']
    rows += [
        f'<span><span class="badge">{_esc(_row_label(view, r))}</span> {_esc(view.sequences[c[0]].policy)}'
        f" · {_esc(', '.join(sorted({view.sequences[i].agent for i in c})))}</span>"
        for r, c in enumerate(view.rows)
    ] or ["<span>none</span>"]
    untrained = ", ".join(f"#{s.index}" for s in view.sequences if not s.trained)
    if untrained:
        rows.append(f'<span class="muted">no row (not trained): {untrained}</span>')
    info = "".join(
        f'<tr><th>{_esc(k)}</th><td class="mono">{_esc(v if isinstance(v, str) else _json(v))}</td></tr>'
        for k, v in view.info.items()
    )
    error = f'<div class="error">{_esc(view.error)}</div>' if view.error else ""
    return (
        f'<details class="trace" id="{anchor}" open><summary><h2>trace <code>{_esc(view.id)}</code></h2> '
        f'<span class="badge st-{_esc(view.status)}">{_esc(view.status)}</span></summary>'
        f'<div class="facts">{"".join(facts)}</div>{error}{agents}'
        f'<div class="rows">{"".join(rows)}</div>'
        f"{f'<table>{info}</table>' if info else ''}"
        f"{''.join(_sequence_card(view, s, colours) for s in view.sequences)}</details>"
    )


def _index(views: list[TraceView]) -> str:
    rows = "".join(
        f'<tr><td><a href="#trace-{k}">{_esc(v.id)}</a></td><td>{_esc(v.group)}</td>'
        f'<td><span class="badge st-{_esc(v.status)}">{_esc(v.status)}</span></td>'
        f"<td>{_num(v.reward)}</td><td>{_esc(', '.join(v.agents))}</td><td>{len(v.sequences)}</td>"
        f"<td>{len(v.rows)}</td></tr>"
        for k, v in enumerate(views)
    )
    return (
        "<table><tr><th>trace</th><th>group</th><th>status</th><th>reward</th><th>agents</th>"
        f"<th>sequences</th><th>rows</th></tr>{rows}</table>"
    )


def render_page(views: list[TraceView], title: str, subtitle: str = "") -> str:
    """One HTML document: legend, an index of the traces, then every trace in full."""
    colours = _colours(views)
    sections = "".join(_trace_section(v, f"trace-{k}", colours) for k, v in enumerate(views))
    sub = f'<div class="muted">{_esc(subtitle)}</div>' if subtitle else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{CSS}</style></head>\n"
        f'<body style="margin:0;background:#f6f8fa"><div class="tv"><h1>{_esc(title)}</h1>{sub}{LEGEND}{NOTES}'
        f"{_index(views) if len(views) > 1 else ''}{sections}</div></body></html>\n"
    )


def render_sequence(view: TraceView, index: int) -> str:
    """One sequence's card with its own CSS: a self-contained fragment (a wandb.Html cell)."""
    card = _sequence_card(view, view.sequences[index], _colours([view]))
    return f'<style>{CSS}</style><div class="tv">{LEGEND}{card}</div>'
