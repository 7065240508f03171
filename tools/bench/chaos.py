"""A chaos soak: a seeded nemesis strikes a real training run at random times, and checkers read
what the run trained afterwards, in the manner of Jepsen (a nemesis, a history, checkers over it)
and FoundationDB's simulation (a seeded schedule that replays, a deterministic oracle).

    python -m tools.bench.chaos [--seed 0] [--faults 30] [--modes sync,async] [--kinds ...] [--quick]

The run: the smoke experiment with solver_verifier (the verifier a frozen policy whose engine runs
vLLM's engine core in a child process, `engine.core=process`, so that a core can die under its
actor), two rollout workers, two learner ranks, a checkpoint every 2 steps, every step's traces
kept (`trainer.rollouts_every=1`), deadlines tightened so that a hang surfaces in seconds. Its
driver is `scripts/train.py` in a child process on a Ray cluster this script holds; a supervisor
starts it again with `trainer.resume=auto` whenever it dies (as `scripts/submit.sh` users'
job retries would).

- `sync` mode: `trainer.deterministic=true`. First a reference run without faults (the full soak
  runs two and reports whether they agree: the determinism self-test), then the same run under the
  nemesis; `digest_equal` says whether it ended with the reference's weights, to the bit, and
  `first_divergent_step` which step's traces (token ids, log-probs, rewards) first differed.
- `async` mode: `trainer.max_staleness=1`, no oracle: async runs promise no loss, no duplicate and
  the staleness bound, which the checkers read.

The nemesis waits a random 1-5 s, strikes one fault of a kind drawn from a seeded shuffle (every
kind comes before any comes again), and waits until the run has healed: logged two steps past the
last one before the strike (a fault is met at the latest in the next step), or finished. A heal
slower than the fault's bound, from the run's own deadlines (`bounds`), counts in
`heal_over_bound`. Checkers over the run's
history (rollouts/step_*.jsonl, metrics.jsonl, summary.json):
- `lost`: groups of a step (its slots, trainer/loop.py::step_tasks) that no step trained;
- `duplicated`: a slot trained twice, a trace id twice in a step, or the ledger's duplicates;
- `run_finished`: summary.json written with every step's row; `ledger_balanced`: the ledger's
  trained + stale + failed = submitted, none open (trainer/ledger.py); `unexpected_stops`: driver
  processes that ended other than by a fault meant to end them (the supervisor's resume would
  hide a bug);
- sync: `digest_equal`, `first_divergent_step`; async: `lags` (each trace's versions behind its
  step; over trainer.max_staleness it was left out, and the ledger counts its group stale).

`--quick`: the sync mode only, one reference run, every engine's core on a thread (they start in
a third of the time), five faults (engine actor, SIGSTOPped engine, worker, learner rank, driver):
the bench lane's run. The last
output line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import ray

from rollout.config import RayConfig
from rollout.log import setup_logging
from rollout.orchestration.cluster import JOIN_ENV, start_ray
from rollout.trace import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    "experiment=smoke",
    "harness=solver_verifier",
    "agents.verifier=frozen",
    "+policies.frozen.engine.core=process",  # a core process to kill under its actor
    "logger=disabled",
    "eval.size=0",
    "rollout.num_workers=2",
    "rollout.group_size=4",
    "trainer.groups_per_step=4",
    "trainer.save_every=2",
    "trainer.rollouts_every=1",
    "learner.lr=3e-4",  # a tenth of smoke's: the reward is not saturated within the run, every step trains
    "rollout.retries=2",
    # engine.max_restarts is a lifetime budget per engine (Ray's): the soak strikes one engine more often
    # than 3 times, and tests healing, not the budget (an engine out of restarts stops the run; resumed)
    "engine.max_restarts=100",
    # deadlines tightened (review reliability_faults.md §2.5): a hang surfaces in seconds
    "engine.health_check_s=2",
    "engine.health_timeout_s=10",
    "engine.request_timeout_s=30",
    "engine.start_timeout_s=120",
    "engine.sync_timeout_s=60",
    "rollout.timeout_s=120",
    "rollout.health_check_s=2",
    "rollout.health_timeout_s=10",
    "rollout.worker_restart_timeout_s=120",
    "learner.call_timeout_s=180",
    "learner.dist_timeout_s=60",
    "trainer.rollout_timeout_s=300",
]
MODES = {
    "sync": [
        "trainer.deterministic=true",
        "engine.max_num_seqs=1",
        "engine.prefix_caching=false",
        "learner.torch_threads=1",
    ],
    "async": ["trainer.max_staleness=1"],
}
QUICK_KINDS = ["engine_actor", "engine_stop", "worker_kill", "learner_kill", "driver_kill"]
STOPS_THE_RUN = ("driver_kill", "save_kill", "buffer_kill")  # the faults the supervisor's resume heals
HANG_S = 5.0  # a harness stall (well inside rollout.timeout_s: transparent)
SLOW_S = 8.0  # a slow engine: stopped 60% of each 100 ms for this long
LEARNER_SETUP_S = 900.0  # trainer/learner_group.py: LearnerGroup's setup_timeout_s


def setting(key: str, default: float) -> float:
    """A number RUN sets (the run's deadlines), else the config's default."""
    for item in RUN:
        if item.split("=")[0].lstrip("+") == key:
            return float(item.split("=")[1])
    return default


def bounds(step_s: float, start_s: float) -> dict[str, float]:
    """How long each fault may take to heal, from the run's own deadlines: what can elapse before
    the fault is seen and repaired, plus the steps it may cost again (up to a checkpoint's worth,
    trainer.save_every, and the step it hit) at twice the reference run's slowest step. A driver
    that dies costs a start (`start_s`: engine.start_timeout_s and the learners' setup)."""
    g = setting
    steps = (g("trainer.save_every", 2) + 3) * 2 * step_s
    engine_start = g("engine.start_timeout_s", 300) + g("engine.request_timeout_s", 240)
    return {
        "engine_actor": engine_start + steps,
        "engine_core": engine_start + 1.0 + steps,
        "engine_stop": g("engine.health_check_s", 30) + g("engine.health_timeout_s", 120) + engine_start + steps,
        "engine_slow": SLOW_S + steps,
        "worker_kill": g("rollout.worker_restart_timeout_s", 300) + steps,
        "worker_stop": g("rollout.health_check_s", 30)
        + g("rollout.health_timeout_s", 120)
        + g("rollout.worker_restart_timeout_s", 300)
        + steps,
        "learner_kill": LEARNER_SETUP_S + g("engine.sync_timeout_s", 600) + steps,
        "harness_hang": HANG_S + steps,
        "buffer_kill": start_s + steps,
        "driver_kill": start_s + steps,
        "save_kill": start_s + steps,
    }


# ---- the run and its supervisor -------------------------------------------------------------
class Supervised:
    """scripts/train.py in a child process on this script's Ray cluster, started again with
    trainer.resume=auto each time it dies (at most `max_starts` starts)."""

    def __init__(self, run_dir: Path, overrides: list[str], max_starts: int = 40):
        self.run_dir, self.overrides, self.max_starts = run_dir, overrides, max_starts
        self.starts, self.proc = 0, None
        self.log = open(run_dir.parent / f"{run_dir.name}.log", "ab")
        self.exit_codes: list[int] = []
        self.stops: list[dict] = []  # each start that ended other than well: its exit code and last error line
        self._since = 0  # the log's size when the current start began

    def start(self) -> None:
        resume = ["trainer.resume=auto"] if self.starts else ["trainer.overwrite=true"]
        cmd = [sys.executable, "scripts/train.py", *self.overrides, f"run_dir={self.run_dir}", *resume]
        self.log.flush()
        self._since = self.log.tell()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    def stopped(self, code: int) -> None:
        """Note a start that ended with `code` (not 0): a SIGKILL is the nemesis's; anything else says
        why in the log's last error line."""
        with open(self.log.name, "rb") as f:
            f.seek(self._since)
            lines = f.read().decode(errors="replace").splitlines()
        errors = [x for x in lines if "Error" in x or "error" in x or "Timeout" in x]
        self.stops.append({"start": self.starts, "exit": code, "error": (errors[-1] if errors else "")[-300:]})

    def run(self, stop: threading.Event) -> bool:
        """Until the run ends well (True) or has used its starts (False)."""
        self.start()
        while True:
            code = self.proc.wait()
            self.exit_codes.append(code)
            if code != 0:
                self.stopped(code)
            if code == 0:
                stop.set()
                return True
            if self.starts >= self.max_starts:
                stop.set()
                return False
            self.start()

    def kill(self) -> None:
        """SIGKILL the driver (its process group: the train.py process)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def progress(run_dir: Path) -> int:
    """The highest step the run has logged (summary.json: finished, a step past every other)."""
    if (run_dir / "summary.json").exists():
        return 1 << 30
    path, best = run_dir / "metrics.jsonl", 0
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if "rollout/reward" in row:
                    best = max(best, row["step"])
    return best


# ---- the nemesis ------------------------------------------------------------------------------
def actors(prefix: str) -> list:
    return [
        ray.get_actor(a["name"], namespace=a["namespace"])
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(prefix)
    ]


def pick(rng: random.Random, prefix: str, method: str) -> dict:
    """One live actor named `prefix`... (drawn by `rng`): its `method()` answer (a pid inside)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = actors(prefix)
        rng.shuffle(found)
        for handle in found:
            with contextlib.suppress(Exception):
                return {"handle": handle, **ray.get(getattr(handle, method).remote(), timeout=5)}
        time.sleep(0.5)
    raise RuntimeError(f"no live actor named {prefix}* answered {method}()")


def duty_cycle(proc: psutil.Process, seconds: float, stopped: float = 0.6, slice_s: float = 0.1) -> None:
    end = time.monotonic() + seconds
    with contextlib.suppress(psutil.NoSuchProcess):
        while time.monotonic() < end:
            proc.suspend()
            time.sleep(slice_s * stopped)
            proc.resume()
            time.sleep(slice_s * (1 - stopped))


def strike(kind: str, rng: random.Random, run: Supervised) -> str:
    """Inject one fault of `kind`; returns what was struck."""
    kill, stop = (lambda pid: psutil.Process(pid).kill()), (lambda pid: psutil.Process(pid).suspend())
    if kind in ("engine_actor", "engine_stop", "engine_slow"):
        a = pick(rng, "tracerl-engine-", "info")
        if kind == "engine_actor":
            kill(a["pid"])
        elif kind == "engine_stop":
            stop(a["pid"])  # alive, answering nothing: the watchdog's to find
        else:
            duty_cycle(psutil.Process(a["pid"]), SLOW_S)
        return f"engine pid {a['pid']}"
    if kind == "engine_core":
        a = pick(rng, "tracerl-engine-frozen-", "info")
        for pid in a["core_pids"]:
            kill(pid)
        return f"engine core pids {a['core_pids']} (actor pid {a['pid']})"
    if kind in ("worker_kill", "worker_stop"):
        a = pick(rng, "tracerl-worker-", "stats")
        (kill if kind == "worker_kill" else stop)(a["pid"])
        return f"rollout worker pid {a['pid']}"
    if kind == "learner_kill":
        a = pick(rng, "tracerl-learner-", "info")
        kill(a["pid"])
        return f"learner rank {a['rank']} pid {a['pid']}"
    if kind == "buffer_kill":
        a = pick(rng, "tracerl-buffer-", "stats")
        kill(a["pid"])
        return f"trace buffer pid {a['pid']}"
    if kind == "harness_hang":
        a = pick(rng, "tracerl-worker-", "stats")
        ray.get(a["handle"].__ray_call__.remote(_arm_hang), timeout=30)
        return f"a harness of rollout worker pid {a['pid']} stalls {HANG_S} s"
    if kind == "driver_kill":
        run.kill()
        return f"driver pid {run.proc.pid}"
    if kind == "save_kill":
        deadline = time.monotonic() + 300  # the next checkpoint's write: kill while its .partial exists
        while not any((run.run_dir / "checkpoints").glob("step_*.partial")):
            if time.monotonic() > deadline:
                return "missed: no save began"
            time.sleep(0.005)
        run.kill()
        return f"driver pid {run.proc.pid} during a save"
    raise ValueError(f"unknown fault kind {kind!r}")


def _arm_hang(worker) -> None:
    """Inside a RolloutWorker actor: its next episode stalls HANG_S seconds (rollout/faultpoints.py)."""
    from rollout import faultpoints

    faultpoints.arm("harness_hang", times=1, arg=HANG_S)


@dataclass
class Nemesis:
    """A thread that strikes `count` faults of `kinds`, one at a time, each healed before the next."""

    run: Supervised
    kinds: list[str]
    count: int
    seed: int
    bound: dict[str, float]
    stop: threading.Event
    log: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self._run, name="nemesis", daemon=True)
        t.start()
        return t

    def _schedule(self, rng: random.Random):
        while True:  # every kind before any kind again
            order = list(self.kinds)
            rng.shuffle(order)
            yield from order

    def _run(self) -> None:
        rng = random.Random(self.seed)
        kinds = self._schedule(rng)
        while len(self.log) < self.count and not self.stop.is_set():
            if self.stop.wait(rng.uniform(1.0, 5.0)) or progress(self.run.run_dir) < 1:
                continue  # first a step: the actors are up
            kind, before = next(kinds), progress(self.run.run_dir)
            t0 = time.monotonic()
            try:
                what = strike(kind, rng, self.run)
            except Exception as e:  # noqa: BLE001 - a strike that found nothing to strike: noted, the soak goes on
                self.errors.append(f"{kind}: {type(e).__name__}: {e}")
                continue
            # healed: two steps past the one it struck logged (a fault is met at the latest in the next
            # step: an idle engine's at the next rollout, a learner's at the next train step)
            while progress(self.run.run_dir) < before + 2 and not self.stop.is_set():
                if time.monotonic() - t0 > self.bound[kind] * 2:
                    break
                time.sleep(0.2)
            healed = progress(self.run.run_dir) >= before + 2
            heal_s = round(time.monotonic() - t0, 1)
            self.log.append({"kind": kind, "what": what, "at_step": before, "healed": healed, "heal_s": heal_s})
            print(json.dumps({"fault": self.log[-1]}), flush=True)


# ---- one run, and its checkers ----------------------------------------------------------------
def one_run(run_dir: Path, overrides: list[str], nemesis: dict | None) -> dict:
    """A supervised run (with a nemesis: {kinds, count, seed, bound}); what its checkers found."""
    run, stop = Supervised(run_dir, overrides), threading.Event()
    t0 = time.monotonic()
    nem = Nemesis(run, stop=stop, **nemesis) if nemesis else None
    thread = nem.start() if nem else None
    finished = run.run(stop)
    if thread:
        thread.join(timeout=60)
    out = {"finished": finished, "wall_s": round(time.monotonic() - t0, 1), "starts": run.starts, "nemesis": nem}
    return {**out, "stops": run.stops}


def history(run_dir: Path, steps: int) -> dict[int, list]:
    """step -> its traces, from rollouts/step_<n>.jsonl (what each step of the final lineage trained)."""
    out = {}
    for k in range(1, steps + 1):
        path = run_dir / "rollouts" / f"step_{k}.jsonl"
        out[k] = list(read_jsonl(path)) if path.exists() else []
    return out


def check(run_dir: Path, steps: int, groups_per_step: int, reference: dict | None) -> dict:
    """The checkers over a finished (or stopped) run's history; `reference`: a fault-free sync
    run's history and summary (None: async, no oracle)."""
    hist = history(run_dir, steps)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    slots = Counter(t.info.get("slot") for traces in hist.values() for t in traces if t.id.endswith("#0"))
    expected = set(range(steps * groups_per_step))
    twice_in_a_step = sum(len(traces) - len({t.id for t in traces}) for traces in hist.values())
    ledger = summary.get("ledger", {})
    out = {
        "lost": len(expected - set(slots)),
        "duplicated": sum(n - 1 for n in slots.values()) + twice_in_a_step + ledger.get("duplicated", 0),
        "run_finished": bool(summary) and all(hist[k] for k in hist),
        "ledger": ledger,
        "ledger_balanced": bool(ledger.get("balanced")) and ledger.get("open") == 0,
        "failed_traces": sum(t.status == "failed" for traces in hist.values() for t in traces),
        "learner_restarts": summary.get("learner_restarts"),
        "engine_restarts": summary.get("engine_restarts"),
        "worker_restarts": summary.get("worker_restarts"),
        "digest": summary.get("policies", {}).get("main", {}).get("digest"),
    }
    # every driver process's "learners rebuilt ... in X s" (the metrics rows of a process a later resume
    # went back past are gone; its log is not)
    log_text = (run_dir.parent / f"{run_dir.name}.log").read_text(errors="replace")
    out["learner_rebuild_s"] = [float(x) for x in re.findall(r"learners rebuilt \(.*?\) in ([\d.]+) s", log_text)]
    if reference is None:
        # how many versions behind its step's weights each trace's oldest trained sequence was; past
        # max_staleness a trace is in the history but left out of training (the ledger's stale)
        lags = Counter(
            k - 1 - min(s.version for s in t.sequences if s.trainable)
            for k, traces in hist.items()
            for t in traces
            if any(s.trainable for s in t.sequences)
        )
        out["lags"] = {str(lag): n for lag, n in sorted(lags.items())}
        return out
    out["digest_equal"] = out["digest"] is not None and out["digest"] == reference["digest"]
    out["first_divergent_step"] = next(
        (k for k in range(1, steps + 1) if fingerprint(hist[k]) != fingerprint(reference["history"][k])), None
    )
    return out


def fingerprint(traces: list) -> list:
    """What a step trained, trace by trace: ids, every sequence's tokens and log-probs, rewards."""
    return sorted(
        (
            t.id,
            t.reward,
            t.status,
            [(list(s.prompt_ids), list(s.completion_ids), list(s.logprobs)) for s in t.sequences],
        )
        for t in traces
    )


# ---- the soak ---------------------------------------------------------------------------------
def mode_soak(mode: str, args, root: Path) -> dict:
    run = [o for o in RUN if not (args.quick and o.startswith("+policies.frozen.engine.core"))]
    overrides = [*run, *MODES[mode], f"trainer.steps={args.steps}", f"seed={args.seed}"]
    gps = int(setting("trainer.groups_per_step", 8))
    refs = []
    for i in range(args.references if mode == "sync" else 0):
        d = root / f"{mode}-reference-{i}"
        r = one_run(d, overrides, None)
        refs.append({**r, **check(d, args.steps, gps, None), "history": history(d, args.steps)})
        print(json.dumps({"reference": mode, "wall_s": r["wall_s"], "digest": refs[-1]["digest"]}), flush=True)
    rows = []
    for d in (root / f"{mode}-reference-0",):
        if d.exists():
            rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if "rollout/reward" in x]
    step_s = max((r["perf/step_s"] for r in rows), default=10.0)
    start_s = refs[0]["wall_s"] if refs else 180.0
    bound = bounds(step_s, start_s)
    d = root / f"{mode}-chaos"
    nemesis = {"kinds": args.kinds, "count": args.faults, "seed": args.seed, "bound": bound}
    r = one_run(d, overrides, nemesis)
    nem = r.pop("nemesis")
    found = check(d, args.steps, gps, refs[0] if refs else None)
    heals = [f for f in nem.log]
    return {
        "mode": mode,
        "references": [{"wall_s": x["wall_s"], "digest": x["digest"]} for x in refs],
        "reference_digests_equal": len({x["digest"] for x in refs}) == 1 if refs else None,
        "wall_s": r["wall_s"],
        "starts": r["starts"],
        "stops": r["stops"],  # every start that ended other than well, with why
        "faults": dict(Counter(f["kind"] for f in heals)),
        "fault_log": heals,
        "nemesis_errors": nem.errors,
        "bound_s": {k: round(v, 1) for k, v in bound.items() if k in args.kinds},
        "heal_s_by_kind": {
            k: {"max": max(f["heal_s"] for f in heals if f["kind"] == k), "n": sum(f["kind"] == k for f in heals)}
            for k in sorted({f["kind"] for f in heals})
        },
        "max_heal_s": max((f["heal_s"] for f in heals), default=0.0),
        # driver processes that ended other than by a fault meant to end them (a bug the resume would hide)
        "unexpected_stops": r["starts"] - 1 - sum(f["kind"] in STOPS_THE_RUN for f in heals),
        "heal_over_bound": sum((not f["healed"]) or f["heal_s"] > bound[f["kind"]] for f in heals),
        **found,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="the nemesis's schedule and the runs' seed")
    ap.add_argument("--faults", type=int, default=30, help="faults per mode")
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default: enough for the faults)")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--kinds", default=",".join(bounds(1, 1)), help=f"of {sorted(bounds(1, 1))}")
    ap.add_argument("--references", type=int, default=2, help="fault-free sync runs (2: the determinism self-test)")
    ap.add_argument("--keep", action="store_true", help="keep the run dirs (named in the output)")
    ap.add_argument(
        "--quick", action="store_true", help="sync only, one reference, 5 faults of the thread core's kinds"
    )
    args = ap.parse_args()
    if args.quick:
        args.modes, args.faults, args.references, args.kinds = "sync", len(QUICK_KINDS), 1, ",".join(QUICK_KINDS)
    args.kinds = args.kinds.split(",")
    unknown = sorted(set(args.kinds) - set(bounds(1, 1)))
    if unknown:
        raise SystemExit(f"--kinds: unknown {unknown}; choose from {sorted(bounds(1, 1))}")
    args.steps = args.steps or 3 * args.faults + 6  # a fault heals over two steps; room for a wait between
    start_ray(RayConfig(address="local", num_cpus=16))
    os.environ[JOIN_ENV] = ray.get_runtime_context().gcs_address  # the driver joins this cluster
    root, t0 = Path(tempfile.mkdtemp(prefix="bench-chaos-")), time.time()
    try:
        modes = {}
        for m in args.modes.split(","):
            modes[m] = mode_soak(m, args, root)
            print(json.dumps({"mode_done": modes[m]}), flush=True)  # progress: each mode's checkers
    finally:
        ray.shutdown()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    runs = list(modes.values())
    faults = Counter()
    for r in runs:
        faults.update(r["faults"])
    print(
        json.dumps(
            {
                "bench": "chaos",
                "quick": args.quick,
                "seed": args.seed,
                "steps": args.steps,
                "overrides": RUN,
                "modes": modes,
                "faults": dict(faults),
                "lost": sum(r["lost"] for r in runs),
                "duplicated": sum(r["duplicated"] for r in runs),
                "max_heal_s": max((r["max_heal_s"] for r in runs), default=0.0),
                "heal_over_bound": sum(r["heal_over_bound"] for r in runs),
                "unexpected_stops": sum(r["unexpected_stops"] for r in runs),
                "run_finished": all(r["run_finished"] for r in runs),
                "digest_equal": all(r["digest_equal"] for r in runs if "digest_equal" in r)
                if "sync" in modes
                else None,
                **({"run_dirs": str(root)} if args.keep else {}),
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    setup_logging()
    main()
