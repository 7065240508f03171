"""The team study's per-item records: items.records() with a team's draft, verdict and cut calls,
a game's outcome; and a team evaluation's items in short (team_stats)."""

from __future__ import annotations

import statistics

from harnesses.verifiers.answers import extract_answer
from rollout.trace import Trace
from studies.items import records


def study_records(traces: list[Trace], decode) -> list[dict]:
    """studies.items.records() of the traces, a team's (harnesses/programs/solver_verifier.py) with
    its draft's score and answer, the verdict (True: CORRECT, False: WRONG, None: none given) and
    each role's calls cut at max_tokens; a game's (harnesses/programs/selfplay.py) with its outcome."""
    recs = records(traces, decode)
    by_id = {t.info.get("task", t.group): t for t in traces}
    for rec in recs:
        t = by_id[rec["id"]]
        if "draft_score" in t.info:
            solver = [s for s in t.sequences if s.agent == "solver"]
            rec["draft_score"] = t.info["draft_score"]
            rec["draft_answer"] = extract_answer(decode(solver[0].completion_ids)) if solver else None
            if "verdict" in t.info:
                rec["verdict"] = t.info["verdict"]
            rec["cut_by_role"] = {
                r: sum(s.finish_reason == "length" for s in t.sequences if s.agent == r) for r in t.agents
            }
        if "forfeit" in t.info:
            rec["game"] = {k: t.info[k] for k in ("winner", "forfeit", "moves", "stones", "first_player_wins")}
    return recs


def team_stats(recs: list[dict]) -> dict | None:
    """A team evaluation's items in short (None for items of no team): the draft's and the final
    answer's accuracy; the revision (final answer != draft's: `changed`; `fixes`: a wrong draft made
    right, `breaks`: a right one made wrong); the verdict against the draft's correctness
    (confusion[draft right | wrong][said correct | wrong | none]; TPR: CORRECT on right drafts, TNR:
    WRONG on wrong ones, a missing verdict counting as neither; Youden's J = TPR + TNR - 1), beside
    the verdict-right rate of the best constant verdict; missing verdicts and truncated traces."""
    team = [r for r in recs if "draft_score" in r]
    if not team:
        return None
    said = {True: "correct", False: "wrong", None: "none"}
    confusion = {d: dict.fromkeys(said.values(), 0) for d in ("right", "wrong")}
    for r in team:
        confusion["right" if r["draft_score"] >= 1 else "wrong"][said[r.get("verdict")]] += 1
    right, wrong = (sum(confusion[d].values()) for d in ("right", "wrong"))
    tpr = confusion["right"]["correct"] / right if right else None
    tnr = confusion["wrong"]["wrong"] / wrong if wrong else None
    n = len(team)
    return {
        "items": n,
        "failed": sum(r["failed"] for r in recs),  # traces with no team record (the harness did not finish)
        "final": round(statistics.fmean(r["reward"] for r in team), 4),
        "draft": round(right / n, 4),
        "changed": sum(r["answer"] != r["draft_answer"] for r in team),
        "fixes": sum(r["draft_score"] < 1 and r["reward"] >= 1 for r in team),
        "breaks": sum(r["draft_score"] >= 1 and r["reward"] < 1 for r in team),
        "confusion": confusion,
        "tpr": None if tpr is None else round(tpr, 4),
        "tnr": None if tnr is None else round(tnr, 4),
        "youden_j": None if tpr is None or tnr is None else round(tpr + tnr - 1, 4),
        "verdict_right": round((confusion["right"]["correct"] + confusion["wrong"]["wrong"]) / n, 4),
        "best_constant": round(max(right, wrong) / n, 4),
        "missing_verdict": round((confusion["right"]["none"] + confusion["wrong"]["none"]) / n, 4),
        "truncated": round(sum(r["truncated"] for r in team) / n, 4),
        "cut_calls": {role: sum(r["cut_by_role"].get(role, 0) for r in team) for role in ("solver", "verifier")},
    }
