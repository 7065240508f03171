"""The curves of docs/results.md: one PNG per published run, from its committed metrics.

    python -m studies.plot_results                                   # docs/results/*/curves.png
    python -m studies.plot_results --add runs/smollm2_solver_verifier make_train_2026-12-03

`--add RUN_DIR NAME` publishes a finished run: its metrics.jsonl trimmed to the keys plotted
(KEYS, a few kB), the headline numbers of its summary.json, and each held-out evaluation's items
(`step_<N>.items.jsonl.gz` and `.meta.json`, which studies/results_check.py recomputes the page's
numbers from) go to docs/results/NAME/, with `--command` (what was run) in run.json; then every
run's figure is drawn again. A figure has three panels: the sampled training reward per step
with the held-out (greedy) eval reward at the steps it was measured; where each step's seconds
went (rollout wait, train, weight sync); the engine-vs-learner mismatch KL of each trained policy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
KEYS = (
    "step",
    "time_s",
    "rollout/reward",
    "eval/reward",
    "perf/step_s",
    "perf/rollout_wait_s",
    "perf/train_s",
    "perf/sync_s",
)
POLICY_KEYS = ("loss", "mismatch_kl")  # train/<policy>/<key>, kept for every trained policy
ROLE_KEYS = ("sequences", "nonzero_adv")  # train/<policy>/<key>/<role>: which roles' rows were trained
SUMMARY_KEYS = (
    "initial_eval_reward",
    "final_eval_reward",
    "eval_size",
    "eval_paired",
    "eval_failed",
    "steps",
    "wall_s",
    "trained_tokens",
)


def trim(row: dict) -> dict:
    """A metrics row with only the keys the figures (and the results tables) use."""
    return {
        k: v
        for k, v in row.items()
        if k in KEYS
        or (k.startswith("train/") and k.count("/") == 2 and k.rsplit("/", 1)[1] in POLICY_KEYS)
        or (k.startswith("train/") and k.count("/") == 3 and k.split("/")[2] in ROLE_KEYS)
    }


def add_run(run_dir: Path, name: str, command: str | None = None) -> Path:
    """Copy a finished run's trimmed metrics, headline summary and per-item evaluations into
    docs/results/<name>/."""
    from studies.items import publish_evals

    summary = json.loads((run_dir / "summary.json").read_text())
    out = RESULTS / name
    out.mkdir(parents=True, exist_ok=True)
    rows = [trim(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "summary.json").write_text(
        json.dumps({k: summary[k] for k in SUMMARY_KEYS if k in summary}, indent=2) + "\n"
    )
    steps = publish_evals(run_dir, out)
    if len(steps) < 2:
        raise SystemExit(f"{run_dir}/eval holds {len(steps)} evaluation(s): a published run needs its first and last")
    (out / "run.json").write_text(json.dumps({"command": command, "eval_steps": steps}, indent=2) + "\n")
    return out


def load(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def plot(run: Path) -> Path:
    """docs/results/<run>/curves.png from its metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = load(run)
    steps = [r for r in rows if "perf/step_s" in r]
    if not steps:
        raise ValueError(f"{run / 'metrics.jsonl'} has no training step rows (perf/step_s): nothing to plot")
    x = [r["step"] for r in steps]
    fig, (ax_r, ax_t, ax_k) = plt.subplots(1, 3, figsize=(15, 4))
    fig.suptitle(run.name)

    ax_r.plot(x, [r["rollout/reward"] for r in steps], marker=".", label="training reward (sampled)")
    evals = [r for r in rows if "eval/reward" in r]
    # the evaluations as points, unjoined: a line between two evaluations would draw a trend nobody measured
    ax_r.plot([r["step"] for r in evals], [r["eval/reward"] for r in evals], "o", label="held-out eval (greedy)")
    ax_r.set(xlabel="step", ylabel="reward", ylim=(0, 1), title="reward")
    ax_r.legend(loc="upper left", fontsize=8)

    bottom = [0.0] * len(steps)
    for key, label in (("perf/rollout_wait_s", "rollout wait"), ("perf/train_s", "train"), ("perf/sync_s", "sync")):
        values = [r[key] for r in steps]
        ax_t.bar(x, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax_t.set(xlabel="step", ylabel="seconds", title="step time")
    ax_t.legend(fontsize=8)

    policies = sorted({k.split("/")[1] for r in steps for k in r if k.endswith("/mismatch_kl")})
    for p in policies:
        kl = [(r["step"], abs(r[f"train/{p}/mismatch_kl"])) for r in steps if r.get(f"train/{p}/mismatch_kl")]
        ax_k.plot([s for s, _ in kl], [v for _, v in kl], marker=".", label=p)
    ax_k.set(xlabel="step", ylabel="|KL|", yscale="log", title="engine vs learner mismatch KL")
    ax_k.legend(fontsize=8)

    fig.tight_layout()
    out = run / "curves.png"
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--add", nargs=2, metavar=("RUN_DIR", "NAME"), help="publish a finished run first")
    parser.add_argument("--command", help="with --add: the command the run was made with (shown on the page)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of published runs")
    args = parser.parse_args()
    if args.add:
        print(f"added {add_run(Path(args.add[0]), args.add[1], args.command)}")
    runs = sorted(p.parent for p in args.results.glob("*/metrics.jsonl"))
    if not runs:
        raise SystemExit(f"no published runs under {args.results} (*/metrics.jsonl)")
    for run in runs:
        print(f"wrote {plot(run)}")


if __name__ == "__main__":
    main()
