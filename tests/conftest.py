"""Shared fixtures and helpers: one tiny model, one in-process Ray, one engine per test session.

Everything here is real: vLLM's CPU build in an Engine actor, an in-process
Ray cluster, the locally built tiny model with its real tokenizer and chat
template. They are slow to start, so they are shared. Helpers that several
test modules use live here too (`from tests.conftest import ...`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests import lane
from tests.lane import meminfo_gib

ROOT = Path(__file__).resolve().parents[1]
# Ray workers inherit the driver's environment: make `tests.*` importable there
# (test-only harnesses live under tests/).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPT = "What is 3 + 4? Give the final answer as <answer>NUMBER</answer>."
# Easy reasoning-gym chain_sum, as in conf/task/chain_sum.yaml.
EASY_CHAIN_SUM = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}
# The test tiers (pyproject.toml): `make test-fast` runs unit and integration, `make test` all three.
TIERS = ("unit", "integration", "e2e")


# ---- tiers: every test has exactly one ----------------------------------------------------


# Each lane job's wall time on a quiet fresh clone (2026-12-06, 0fc7d29, the main tests beside it; the
# faults bench's quick run is the old killed-engines run): the lane runs the longest first, so that
# what is left when the main tests end is short jobs that its two workers share, not one long job
# (the suite's tail was 107-148 s with the team study and the relay's quick pipeline last). A job not
# listed runs first, as if long.
LANE_WALL_S = {
    "chaos": 300,
    "team_study": 259,
    "relay_runs_quick": 143,
    "faults": 110,
    "two_node_submission": 80,
    "learner": 72,
    "killed_core": 200,
    "readme": 51,
    "smoke_run": 46,
    "e2e": 42,
    "head_without_auth": 37,
    "rollout_path": 35,
    "bf16": 34,
    "lora_ops": 33,
    "relay_condition": 27,
    "relay_training": 60,  # tests/harnesses/test_relay.py: not measured quiet (109 and 216 s on a box at load 40-50)
    "engine_start": 21,
    "gateway_stall": 11,
    "reward_hacks": 3,
    "hostile": 2,
    "tool_parser": 1,
    "trace_io": 0,
}


def lane_job_of(item) -> str | None:
    """The background-lane job a test reads, if any: the smoke run's (the `smoke_run` fixture), or
    its module's: `LANE_TESTS` maps a test's name to its job's (or to a function of the test item
    that names it: one job per parameter)."""
    if "smoke_run" in item.fixturenames:
        return "smoke_run"
    job = getattr(item.module, "LANE_TESTS", {}).get(item.originalname)
    return job(item) if callable(job) else job


def lane_order(job: str) -> float:
    return -LANE_WALL_S.get(job, float("inf"))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: an untiered test must fail every run, not only `make test`
def pytest_collection_modifyitems(config, items):
    """Every test has one tier. The tests that wait for a background-lane job (`lane_job_of`) run
    last, so that the suite works on while the lane does (in the middle of the suite, the team
    study's wait held it up by ~100 s), in the order the lane runs their jobs."""
    waits = sorted((item for item in items if lane_job_of(item)), key=lambda item: lane_order(lane_job_of(item)))
    items[:] = [item for item in items if not lane_job_of(item)] + waits
    bad = [
        f"{item.nodeid}: {' + '.join(tiers) or 'no tier'}"
        for item in items
        if len(tiers := [m.name for m in item.iter_markers() if m.name in TIERS]) != 1
    ]
    if bad:
        raise pytest.UsageError(
            f"every test needs exactly one of the marks {', '.join(TIERS)} "
            "(module `pytestmark` or a decorator):\n  " + "\n  ".join(bad)
        )


def pytest_collection_finish(session):
    """The background lane (tests/lane.py) starts the long script runs that the selected tests read
    (`lane_job_of`), longest first (`LANE_WALL_S`): the smoke run (the `smoke_run` fixture's,
    tests/lane_jobs.py) and each module's jobs (its `lane_jobs()`: name -> lane.Job), e.g. the
    README's command, the fault runs, the quick benches, the team study's quick arms and the relay's
    quick main runs. Not for `--collect-only`, which runs no test (it would wait for the job running
    at its end)."""
    if session.config.option.collectonly:
        return
    jobs = {}
    for item in session.items:
        name = lane_job_of(item)
        if name == "smoke_run":
            from tests.lane_jobs import job

            jobs[name] = job("smoke_run", SMOKE_RUN)
        elif name is not None:
            jobs[name] = item.module.lane_jobs()[name]
    jobs = dict(sorted(jobs.items(), key=lambda kv: lane_order(kv[0])))
    if jobs:
        lane.launch(jobs)
        # a waiting test waits for the jobs queued before its own too, and each job is ended at its
        # own deadline: their sum (and the test's own checks) bound the wait, not pytest's timeout
        # per test (pyproject.toml: 600 s; the team study's test ran out of it on a loaded box)
        bound = sum(lane.Job(*spec).deadline_s for spec in jobs.values()) + 600
        for item in session.items:
            if lane_job_of(item):
                item.add_marker(pytest.mark.timeout(bound), append=False)


def pytest_sessionfinish(session):
    if lane.launched():  # the suite's time: the lane's jobs can be its tail
        MEMORY["lane"] = lane.stop()
    if "start" in CPU:
        CPU["end"] = cpu_times()
    if os.environ.get("TRACERL_YARDSTICK") == "1" and "since" in CPU:  # make test: its time in yardsticks
        from tests.yardstick import line, yardstick_s

        wall = time.monotonic() - CPU["since"]
        y = yardstick_s()  # after the lane stopped: the box is as quiet as it gets
        MEMORY["yardstick"] = f"yardstick {y:.2f} s; " + line("the pytest session", wall, y)


def pytest_terminal_summary(terminalreporter):
    """The lane's job times, the session's time in yardsticks (tests/yardstick.py) and its sampled
    peak memory: the suite's budgets."""
    if "lane" in MEMORY:
        terminalreporter.write_line(MEMORY["lane"])
    if "yardstick" in MEMORY:
        terminalreporter.write_line(MEMORY["yardstick"])
    if "end" in CPU:
        terminalreporter.write_line(cpu_line())
    if "peak_gib" in MEMORY:
        terminalreporter.write_line(
            f"sampled peak used memory (MemTotal - MemAvailable, every {SAMPLE_S:.0f} s, the whole machine, "
            f"the lane included): {MEMORY['peak_gib']:.1f} GiB at {MEMORY['peak_at_s']:.0f} s into the session "
            f"(at its start: {MEMORY['start_gib']:.1f} GiB; the machine has {MEMORY['total_gib']:.1f} GiB)"
        )


# ---- memory: the session's sampled peak; a test that needs much says so ---------------------

SAMPLE_S = 1.0
MEMORY_WAIT_S = 180  # how long a test that needs memory waits for it (the lane's jobs end, a run ends)
MEMORY: dict = {}  # the sampler's peak, and the lane's line for the summary


def sample_memory(stop: threading.Event) -> None:
    """The sampler thread: the peak of MemTotal - MemAvailable, system-wide so that the lane's
    scripts, Ray's workers and the engines' processes all count."""
    since = time.monotonic()
    while not stop.wait(SAMPLE_S):
        total, available = meminfo_gib()
        if total - available > MEMORY["peak_gib"]:
            MEMORY.update(peak_gib=total - available, peak_at_s=time.monotonic() - since)


def pytest_configure(config):
    if Path("/proc/stat").exists() and "start" not in CPU:
        CPU.update(start=cpu_times(), since=time.monotonic())
    if Path("/proc/meminfo").exists() and "peak_gib" not in MEMORY:
        total, available = meminfo_gib()
        MEMORY.update(total_gib=total, start_gib=total - available, peak_gib=total - available, peak_at_s=0.0)
        threading.Thread(target=sample_memory, args=(threading.Event(),), daemon=True, name="memory").start()


def wait_for_memory(who: str, gib: float) -> None:
    """Return once `gib` GiB are available beyond the share Ray's memory monitor keeps free (it
    kills a worker above RAY_memory_usage_threshold, 0.95 of the machine by default); after
    MEMORY_WAIT_S seconds without, fail naming `who`, the need and what was available: a test
    killed by the monitor reads as a bug of the code it tests."""
    total = meminfo_gib()[0]
    need = gib + (1 - float(os.environ.get("RAY_memory_usage_threshold", 0.95))) * total
    deadline = time.monotonic() + MEMORY_WAIT_S
    while (available := meminfo_gib()[1]) < need and time.monotonic() < deadline:
        time.sleep(2)  # memory is freed by other processes: nothing to block on
    if available < need:
        pytest.fail(
            f"{who} needs {gib:g} GiB of memory available to start (+ {need - gib:.1f} GiB that Ray's memory "
            f"monitor keeps free); after {MEMORY_WAIT_S:.0f} s of waiting {available:.1f} of {total:.1f} GiB "
            f"were: run it when the machine has more free",
            pytrace=False,
        )


def pytest_runtest_setup(item):
    """Before the test's own fixtures start: the memory that its `needs_memory_gb` mark names. The
    first test that waits for a lane job marks the end of the main tests (they run first)."""
    if lane_job_of(item) and "start" in CPU and "main" not in CPU:
        CPU.update(main=cpu_times(), main_s=time.monotonic() - CPU["since"])
    if (mark := item.get_closest_marker("needs_memory_gb")) is not None:
        wait_for_memory(item.nodeid, mark.args[0])


# ---- CPU: how busy the box was, for the whole session and its main tests ----------------------

CPU: dict = {}  # /proc/stat's times at the session's start, at the main tests' end, at its end


def cpu_times() -> tuple[int, int]:
    """(busy, total) clock ticks of all the machine's CPUs since boot (/proc/stat's first line;
    idle and iowait are not busy)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def busy(a: tuple[int, int], b: tuple[int, int]) -> float:
    return (b[0] - a[0]) / max(1, b[1] - a[1])


def cpu_line() -> str:
    """What the box's CPUs did: the share of all cores' time that was busy (the lane included),
    for the whole session and for the main tests (until the first test that waits for a lane job)."""
    whole = busy(CPU["start"], CPU["end"])
    line = f"CPU busy (the whole machine, {os.cpu_count()} cores, the lane included): {whole:.0%} of the session"
    if "main" in CPU:
        main = busy(CPU["start"], CPU["main"])
        line += f"; the main tests ended {CPU['main_s']:.0f} s into it, {main:.0%} busy until then"
    return line


# ---- fixtures: the shared real components ---------------------------------------------


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from rollout.models import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def tiny_tied_path() -> str:
    from rollout.models import resolve_model

    return resolve_model("tiny_tied")


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from rollout.config import RayConfig
    from rollout.orchestration.cluster import start_ray

    # More logical CPUs than cores: test actors are mostly idle.
    start_ray(RayConfig(address="local", num_cpus=8))
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def engine_cfg():
    from rollout.config import EngineConfig

    return EngineConfig(num_cpus=1, kv_cache_gb=0.25, max_num_seqs=32)


@pytest.fixture(scope="session")
def engine(ray_cluster, tiny_path, engine_cfg):
    """One Engine actor serving the tiny model (policy "main"); tests that change its weights
    put the original ones back."""
    import ray

    from rollout.config import ModelConfig
    from rollout.orchestration.cluster import spawn_engines

    [e] = spawn_engines({"main": (tiny_path, ModelConfig(name="tiny"), engine_cfg)})["main"]
    yield e
    ray.get(e.shutdown.remote())
    ray.kill(e)


@pytest.fixture(scope="session")
def tied_engine(ray_cluster, tiny_tied_path, engine_cfg):
    """A second Engine actor serving tiny_tied (tied embeddings), started once for the tests that
    push weights into one (rollout/test_engine.py, trainer/test_weight_sync.py); each puts the
    original weights back."""
    import ray

    from rollout.config import ModelConfig
    from rollout.orchestration.cluster import spawn_engines

    [e] = spawn_engines({"main": (tiny_tied_path, ModelConfig(name="tiny_tied"), engine_cfg)})["main"]
    yield e
    ray.get(e.shutdown.remote())
    ray.kill(e)


SMOKE_RUN = Path(tempfile.gettempdir()) / f"tracerl-smoke-run-{os.getpid()}"


@pytest.fixture(scope="session")
def smoke_run():
    """`make smoke`'s run, once per session, as a user starts it: `scripts/train.py experiment=smoke`
    (20 steps, 32 held-out items; traces written at steps 10 and 20), a Ray of its own. It runs in
    the background lane from the session's start (tests/lane_jobs.py smoke_run), and the tests that
    read it run last. Returns (run_dir, the finished process: returncode, stdout, stderr); tests that
    read different facts of the run share it (tests/scripts/test_train_script.py, test_evaluate.py),
    each asserting the exit code it needs."""
    import shutil
    from types import SimpleNamespace

    try:
        yield SMOKE_RUN, SimpleNamespace(**lane.result("smoke_run"))  # pytest_collection_finish launched it
    finally:
        shutil.rmtree(SMOKE_RUN, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def hf_tiny(tiny_path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def fixed_batch(hf_tiny, tiny_tokenizer):
    """Packed micro-batches of 6 single-turn traces with engine-like behaviour log-probs from the
    model, advantages +1 / -1; uneven over 2 ranks (one gets a padding micro-batch)."""
    from rollout.agents.chat_format import ChatFormat
    from rollout.trace import Sequence, Trace
    from trainer.packing import build_rows, pack, token_weights

    fmt = ChatFormat(tiny_tokenizer)
    traces = []
    for i in range(6):
        prompt = fmt.render([{"role": "user", "content": f"What is {i} + {i + 1}?"}])
        completion = fmt.encode(f"The answer is {2 * i + 1}.")
        lps = hf_logprobs(hf_tiny, prompt, completion).tolist()
        traces.append(
            Trace(f"t{i}", f"g{i // 2}", [Sequence(prompt, completion, lps, "solver", "main", 0)], reward=float(i % 2))
        )
    advs = [[1.0 if i % 2 else -1.0] for i in range(6)]
    batches = pack(build_rows(traces, advs, token_weights(traces, "token")), token_budget=64)
    assert len(batches) >= 3
    return batches


@pytest.fixture(scope="session")
def run_harness(engine, tiny_tokenizer):
    """`run_harness(target, roles, task_index=0, frozen=(), max_tokens=16, task=None, **options)`
    runs a harness once on `task` (default: a chain_sum task of 2-3 terms) against the shared
    engine; roles in `frozen` are served by the same engine under the `frozen` policy (recorded
    untrainable). Returns (task, sequences, HarnessResult)."""
    from harnesses.base import as_result, load_harness
    from harnesses.tasks.reasoning_gym import ReasoningGymTasks
    from rollout.agents.chat_format import ChatFormat
    from rollout.agents.client import Agent, TraceRecorder
    from rollout.config import SamplingConfig
    from rollout.gateway.server import Gateway
    from rollout.orchestration.router import Router

    def run(target, roles, task_index=0, frozen=(), max_tokens=16, task=None, **options):
        task = task or ReasoningGymTasks("chain_sum", {"min_terms": 2, "max_terms": 3}).train_task(task_index)
        rec = TraceRecorder(f"t{task_index}")
        fmt = ChatFormat(tiny_tokenizer)
        agents = {
            r: Agent(
                r,
                "frozen" if r in frozen else "main",
                Router([engine]),
                fmt,
                rec,
                SamplingConfig(max_tokens=max_tokens),
                seed=7,
                trainable=r not in frozen,
                gateway=Gateway.shared,  # as the rollout worker hands its agents theirs
            )
            for r in roles
        }
        result = as_result(asyncio.run(load_harness(target)(task, agents, **options)))
        return task, rec.sequences, result

    return run


@pytest.fixture(scope="session")
def run_worker(engine, tiny_path):
    """`run_worker(harness, agents, n_tasks, group_size=2, timeout_s=20, max_tokens=16,
    vocab_size=512)`: one RolloutWorker actor over the shared engine (every policy served by it)
    runs one group per task index 0..n_tasks-1 of easy chain_sum into a fresh TraceBuffer (that
    takes token ids below `vocab_size`). Returns (worker stats, complete groups, buffer stats)."""
    import ray

    from rollout.config import GenerateJobConfig, RolloutConfig, SamplingConfig, TaskConfig
    from rollout.orchestration.cluster import spawn_buffer, spawn_workers

    def run(harness, agents, n_tasks, group_size=2, timeout_s=20.0, max_tokens=16, vocab_size=512):
        policies = set(agents.values())
        cfg = GenerateJobConfig(
            harness=harness,
            agents=agents,
            task=TaskConfig(name="chain_sum", params=EASY_CHAIN_SUM),
            rollout=RolloutConfig(concurrency=8, group_size=group_size, timeout_s=timeout_s),
            sampling=SamplingConfig(max_tokens=max_tokens),
        )
        buffer = spawn_buffer(group_size, {p: vocab_size for p in policies})
        tokenizer = (tiny_path, ray.get(engine.info.remote(), timeout=60)["tokenizer_class"])  # as the fleet does
        [worker] = spawn_workers(cfg, {p: [engine] for p in policies}, {p: tokenizer for p in policies}, buffer)
        try:
            stats = ray.get(worker.run.remote(list(range(n_tasks))), timeout=300)
            groups = ray.get(buffer.get.remote(n_tasks, timeout_s=5), timeout=60)
            return stats, groups, ray.get(buffer.stats.remote(), timeout=60)
        finally:
            ray.kill(worker)
            ray.kill(buffer)

    return run


# ---- helpers ----------------------------------------------------------------------------


def chat_prompt(tok, text: str = PROMPT) -> list[int]:
    """Token ids of one user turn plus the assistant header, through the tokenizer's chat template."""
    return tok.encode(
        tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )


def hf_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0):
    """log pi(completion | prompt) per completion token from an HF fp32 forward, as a tensor."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float() / temperature, dim=-1)  # (tokens, vocab)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return logp[pos, torch.tensor(completion)]


def run_bare_python(args: list[str], cwd, timeout_s: float = 120) -> tuple[int, str]:
    """`python <args>` in `cwd` with only the repository on its path and a bare PATH (the suite's
    own hooks, tried in a pytest or a driver of their own); its exit code and its output."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    return proc.returncode, proc.stdout + proc.stderr


def read_metrics(run_dir) -> list[dict]:
    """The rows of a run's metrics.jsonl."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def fake_checkpoint(run_dir, step, complete=True):
    """A checkpoint folder as `save` leaves it (complete) or as a killed save leaves it (partial)."""
    from trainer import checkpoint

    checkpoint.start(run_dir, step)
    (checkpoint.partial_dir(run_dir, step) / "main").mkdir()
    if complete:
        checkpoint.finish(run_dir, step, {"main": step})
