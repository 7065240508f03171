"""Per-item evaluation results: the record of one evaluated trace, their gzip'd JSONL files (with a
condition's meta file beside them), the token decoder that reads an answer, and a run's held-out
evaluations published as such files.

An item is one held-out task of an evaluation in short (its id, reward, tokens, answer; a relay
team's sub-task steps). The relay's pilot (studies/relay/pilot.py), its main runs
(studies/relay/) and the team study (studies/team/) write and read them; the tests over them are
studies/stats.py's, and what is computed over conditions and seeds studies/contrasts.py's.
"""

from __future__ import annotations

import gzip
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from harnesses.programs.majority_vote import majority
from harnesses.verifiers.answers import extract_answer
from rollout.models import resolve_model
from rollout.trace import Trace, read_jsonl
from trainer.config import compose
from trainer.metrics import write_atomic

# ---- items and their files ------------------------------------------------------------------


def item(trace: Trace, decode: Callable[[list[int]], str] | None) -> dict:
    """One evaluated item in short. `decode` (token ids -> text) reads a non-relay trace's answer
    out of its last sequence."""
    rec = {
        "id": trace.info.get("task", trace.group),
        "reward": trace.reward,
        "tokens": trace.num_generated_tokens,
        "tokens_by_role": {
            r: sum(len(s.completion_ids) for s in trace.sequences if s.agent == r) for r in trace.agents
        },
        "truncated": trace.status == "truncated",
        "failed": trace.status == "failed",
    }
    if trace.agent_rewards:
        rec["roles"] = trace.agent_rewards
    if "expression" in trace.info:  # harnesses/programs/relay.py
        rec.update({k: trace.info[k] for k in ("expression", "steps", "calculator_right")})
        rec["answer"] = trace.info["final"]
    else:
        rec["answer"] = extract_answer(decode(trace.sequences[-1].completion_ids)) if trace.sequences else None
    return rec


def records(traces: list[Trace], decode: Callable[[list[int]], str] | None) -> list[dict]:
    """item() of each trace, in task order. A majority vote's answer is the voted one and its
    samples' answers are kept (item() reads the last sample)."""
    recs = []
    for t in traces:
        rec = item(t, decode)
        if "votes" in t.info:  # harnesses/programs/majority_vote.py
            answers = t.info["answers"]
            rec.update(answer=answers[majority(answers)], answers=answers, votes=t.info["votes"])
        recs.append(rec)
    return sorted(recs, key=item_number)


def decoder(overrides: list[str]) -> Callable[[list[int]], str]:
    """The token decoder (ids -> text) of the composed run's first trained policy."""
    from tokenizers import Tokenizer

    cfg = compose("train", overrides)
    model = cfg.policy_model(cfg.trainable_policies()[0])
    tok = Tokenizer.from_file(str(Path(resolve_model(model.name, model.path)) / "tokenizer.json"))
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def run_decoder(run_dir: Path) -> Callable[[list[int]], str]:
    """The token decoder of a run's base model (`model` of its config.yaml)."""
    from omegaconf import OmegaConf
    from tokenizers import Tokenizer

    model = OmegaConf.load(run_dir / "config.yaml").model
    tok = Tokenizer.from_file(str(Path(resolve_model(model.name, model.path)) / "tokenizer.json"))
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def publish_evals(run_dir: Path, out: Path) -> list[int]:
    """Each held-out evaluation of a run (run_dir/eval/step_<N>.jsonl) as a condition
    `step_<N>` in `out`, its items read with the run's tokenizer; the steps written."""
    decode, steps = run_decoder(run_dir), []
    for path in sorted((run_dir / "eval").glob("step_*.jsonl"), key=lambda p: int(p.stem[5:])):
        step = int(path.stem[5:])
        recs = records(list(read_jsonl(path)), decode)
        write_condition(out, f"step_{step}", recs, {"step": step, "items": len(recs)})
        steps.append(step)
    return steps


def item_number(rec: dict) -> int:
    """The task's number in its id (the sort key of a file's items)."""
    return int(rec["id"].rsplit("/", 1)[1])  # "story_sum/eval/17"


def write_items(path: Path, recs: list[dict]) -> None:
    """One JSON line per item, gzip'd without a timestamp: the same items give the same bytes."""
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:  # the same bytes each time
        out.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs).encode())


def read_items(path: Path) -> list[dict]:
    """The items of a file written by write_items."""
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def write_condition(folder: Path, name: str, recs: list[dict], meta: dict) -> None:
    """One evaluated condition: <name>.items.jsonl.gz, then <name>.meta.json (what it ran at, what
    it took): a meta file means the items are whole."""
    folder.mkdir(parents=True, exist_ok=True)
    write_items(folder / f"{name}.items.jsonl.gz", recs)
    write_atomic(folder / f"{name}.meta.json", json.dumps(meta, indent=2, allow_nan=False))


def read_condition(folder: Path, name: str) -> tuple[list[dict], dict] | None:
    """(items, meta) of a condition written by write_condition; None before its meta file is."""
    if not (folder / f"{name}.meta.json").exists():
        return None
    return read_items(folder / f"{name}.items.jsonl.gz"), json.loads((folder / f"{name}.meta.json").read_text())


def head_commit(root: Path) -> str:
    """The commit checked out at `root` (the repository root): what an evaluation ran at."""
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
