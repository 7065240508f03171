"""Recompute docs/results.md's checked tables from the committed per-item files, and fail on any
difference.

    python -m studies.results_check           # check: exit 1 naming each table that differs
    python -m studies.results_check --write   # rewrite the checked tables from the files

A checked table sits in docs/results.md between `<!-- results_check: NAME -->` and
`<!-- /results_check -->`; NAME is one of TABLES below, each a function of the files under
docs/results/ alone (the per-item evaluations `*.items.jsonl.gz`, their `*.meta.json`, a run's
`status.json`): accuracies, before -> after, better / worse counts and the exact sign test's p
are computed here, never copied. A number of a learning result belongs in such a table: prose
says what the table shows. `make test-studies` runs the check (tests/studies/test_results_check.py).
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from studies.contrasts import CONTRAST_HEAD, accuracy, contrast_rows, table
from studies.items import read_items
from studies.relay.analysis import analyze
from studies.relay.report import SECONDARY, headline_md, markdown
from studies.stats import mean, sign_line, sign_test
from studies.study import ROOT

PAGE = ROOT / "docs" / "results.md"
BLOCK = re.compile(r"(<!-- results_check: (\S+) -->\n)(.*?)(<!-- /results_check -->)", re.S)
RELAY_ARMS = ("single_agent", "team_shared", "team_lora")  # A, B, C of docs/preregistration/relay.md
RELAY_CONTROLS = ("transplant", "swap", "vote", "oracle")


def paired(before: list[dict], after: list[dict]) -> str:
    """`better / worse, p = ...` of the same items from `before` to `after` (p under 0.001 as 1.2e-05)."""
    s = sign_test(before, after)
    return sign_line(s["better"], s["worse"], s["p"], exp_below=1e-3)


def relay_pilot(results: Path) -> list[str]:
    """The pilot gate (docs/results/relay_pilot/): the untrained conditions' accuracy, the team's
    paired counts against the single agent and the exact calculator's against the team, each
    role's sub-task accuracy, and the gate's verdict, which pilot.json records (its accuracies
    must be the items')."""
    rows = []
    for ops in (2, 1):
        folder = results / "relay_pilot" / f"ops{ops}"
        recs = {c: read_items(folder / f"{c}.items.jsonl.gz") for c in ("single", "team", "oracle")}
        pilot = json.loads((folder / "pilot.json").read_text())
        acc = {c: accuracy(r) for c, r in recs.items()}
        for c, a in acc.items():
            if round(a, 4) != pilot["accuracy"][c]:
                raise ValueError(f"{folder}/pilot.json: {c} accuracy {pilot['accuracy'][c]}, its items {a:.4f}")
        reader = mean(r.get("roles", {}).get("reader", 0.0) for r in recs["team"])
        calls = [c for r in recs["team"] for c in r.get("calculator_right", [])]
        rows.append(
            [
                str(ops),
                str(len(recs["team"])),
                f"{acc['single']:.3f}",
                f"{acc['team']:.3f}",
                f"{acc['oracle']:.3f}",
                paired(recs["single"], recs["team"]),
                paired(recs["team"], recs["oracle"]),
                f"{reader:.3f} / {mean(calls):.3f}",
                str(sum(r["truncated"] for r in recs["single"])),
                "passes" if pilot["passed"] else "fails",
            ]
        )
    header = [
        "operations",
        "stories",
        "single agent",
        "team",
        "team, exact calculator",
        "team vs single: better / worse, p",
        "exact calculator vs team",
        "reader / calculator sub-task",
        "single agent's answers cut at max_tokens",
        "gate",
    ]
    return table(header, rows)


def relay_runs(results: Path) -> list[str]:
    """The relay's main runs committed so far (docs/results/relay/<arm>/seed<s>/): each finished
    run's held-out accuracy at its evaluations, the first against the last paired, its tokens, and
    its attempts' wall time (status.json)."""
    rows = []
    for arm in RELAY_ARMS:
        for run in sorted((results / "relay" / arm).glob("seed*"), key=lambda d: int(d.name[4:])):
            status = json.loads((run / "status.json").read_text())
            if status["state"] != "finished":
                continue
            steps = sorted(int(p.name[5:].split(".")[0]) for p in run.glob("step_*.items.jsonl.gz"))
            items = {s: read_items(run / f"step_{s}.items.jsonl.gz") for s in steps}
            last = json.loads((run / f"step_{steps[-1]}.meta.json").read_text())
            lr = next(o.split("=", 1)[1] for o in last["overrides"] if o.startswith("learner.lr="))
            walls = [a["wall_s"] for a in status["attempts"]]
            rows.append(
                [
                    arm,
                    run.name[4:],
                    lr,
                    " → ".join(f"{accuracy(items[s]):.3f}" for s in steps),
                    paired(items[steps[0]], items[steps[-1]]),
                    f"{last['generated_tokens']:,} / {last['trained_tokens']:,}",
                    f"{len(walls)}: " + ", ".join("stopped" if w is None else f"{w:.0f} s" for w in walls),
                ]
            )
    header = [
        "arm",
        "seed",
        "lr",
        "held-out accuracy at steps 0, 10, 20, 30",
        "step 0 vs 30: better / worse, p",
        "generated / trained tokens",
        "attempts: wall",
    ]
    return table(header, rows)


def relay_controls(results: Path) -> list[str]:
    """The relay's evaluation-only controls committed so far (docs/results/relay/controls/), each
    against the trained arm whose weights it reads, on the same stories."""
    against = {"transplant": "single_agent", "swap": "team_lora", "vote": "single_agent", "oracle": "team_lora"}
    rows = []
    for folder in sorted((results / "relay" / "controls").glob("seed*"), key=lambda d: int(d.name[4:])):
        for name in RELAY_CONTROLS:
            path = folder / f"{name}.items.jsonl.gz"
            if not path.exists():
                continue
            recs, meta = read_items(path), json.loads((folder / f"{name}.meta.json").read_text())
            arm = results / "relay" / against[name] / folder.name
            step = int(meta["checkpoint"].rsplit("_", 1)[1])
            base = read_items(arm / f"step_{step}.items.jsonl.gz")
            rows.append(
                [
                    name,
                    folder.name[4:],
                    f"{against[name]}, step {step}",
                    f"{accuracy(base):.3f} → {accuracy(recs):.3f}",
                    paired(base, recs),
                    f"{meta['wall_s']:.0f} s",
                ]
            )
    header = ["control", "seed", "weights of", "the arm → the control", "better / worse, p", "wall"]
    return table(header, rows)


def relay_analysis(results: Path) -> list[str]:
    """The relay's pre-registered analysis (`python -m studies.relay analyze`, the same code) of the
    committed files under docs/results/relay/: the seeds in, the verdict, the three contrasts with
    their bootstrap CIs and Holm-adjusted p, the success criterion, the positive control, addendum
    3's sensitivity check and the secondary contrasts. analysis.md beside the files has the rest;
    it and analysis.json, where present, must be what the analysis writes."""
    a = analyze(results / "relay", pilot=results / "relay_pilot" / "ops1")
    for name, text in (("analysis.json", json.dumps(a, indent=2, allow_nan=False)), ("analysis.md", markdown(a))):
        path = results / "relay" / name
        if path.exists() and path.read_text() != text:
            raise ValueError(f"{path}: not the analysis of the files beside it (python -m studies.relay analyze)")
    secondary = contrast_rows({k: a["secondary"][k] for k in SECONDARY})
    return headline_md(a) + ["Secondary contrasts (CIs only, no claims):", "", *table(CONTRAST_HEAD, secondary)]


def runs(results: Path) -> list[str]:
    """The published training runs (docs/results/<name>/run.json, written by
    `python -m studies.plot_results --add`): the held-out accuracy at the first and last evaluation,
    paired, and the run's wall time.
    The run's own summary.json must agree with its items."""
    rows = []
    for folder in sorted(p.parent for p in results.glob("*/run.json")):
        run, summary = json.loads((folder / "run.json").read_text()), json.loads((folder / "summary.json").read_text())
        steps = run["eval_steps"]
        first, last = (read_items(folder / f"step_{s}.items.jsonl.gz") for s in (steps[0], steps[-1]))
        for key, recs in (("initial_eval_reward", first), ("final_eval_reward", last)):
            if key in summary and abs(summary[key] - accuracy(recs)) > 1e-9:
                raise ValueError(f"{folder}/summary.json: {key} {summary[key]}, its items {accuracy(recs):.4f}")
        rows.append(
            [
                folder.name,
                f"`{run['command']}`" if run.get("command") else "",
                str(len(first)),
                f"{accuracy(first):.3f} → {accuracy(last):.3f}",
                paired(first, last),
                f"{summary['wall_s'] / 60:.1f} min",
            ]
        )
    header = ["run", "command", "held-out items", "before → after", "better / worse, p", "wall"]
    return table(header, rows)


TABLES: dict[str, Callable[[Path], list[str]]] = {
    "relay_pilot": relay_pilot,
    "relay_runs": relay_runs,
    "relay_controls": relay_controls,
    "relay_analysis": relay_analysis,
    "runs": runs,
}


def check(page: str, results: Path) -> tuple[str, dict[str, list[str]]]:
    """The page with every checked table recomputed, and for each table that differs its diff
    lines. An unknown table name is a ValueError naming the known ones."""
    diffs: dict[str, list[str]] = {}

    def redo(m: re.Match) -> str:
        name = m.group(2)
        if name not in TABLES:
            raise ValueError(f"docs/results.md: no table {name!r} to check (known: {', '.join(TABLES)})")
        want = "\n".join(TABLES[name](results)) + "\n"
        if m.group(3) != want:
            diffs[name] = list(difflib.unified_diff(m.group(3).splitlines(), want.splitlines(), "page", "files", n=0))
        return m.group(1) + want + m.group(4)

    return BLOCK.sub(redo, page), diffs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the checked tables from the files")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page (default docs/results.md)")
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results", help="the files' folder")
    args = parser.parse_args(argv)
    page = args.page.read_text(encoding="utf-8")
    names = [m.group(2) for m in BLOCK.finditer(page)]
    new, diffs = check(page, args.results)
    if args.write:
        args.page.write_text(new, encoding="utf-8")
    for name, lines in diffs.items():
        print(f"[results_check] {name}: the page differs from its files" + ("" if args.write else ":"), flush=True)
        if not args.write:
            print("\n".join(lines), flush=True)
    print(json.dumps({"tables": names, "differ": sorted(diffs), "written": args.write and bool(diffs)}))
    if diffs and not args.write:
        sys.exit(1)


if __name__ == "__main__":
    main()
