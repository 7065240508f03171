"""Ray clusters on this machine, started by our scripts; jobs submitted with scripts/submit.sh.

Token auth: a head started with scripts/ray_start.sh on a fresh machine (its
own HOME, so this machine's ~/.ray/auth_token, which the in-process clusters of
the other tests read, is never touched) refuses a job without the token, and
submit.sh refuses a head started without auth. Two nodes: the head and a second
node each get their own temp dir, ports and custom resources. Two trained
policies: the cluster preset puts `main`'s engine on the head and its learner
ranks on the second node; `critic` asks for a resource only the second node has,
so its engine and learner rank go there. Every test stops only the processes it
started (never `ray stop`: it stops every Ray on the machine).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import lane
from tests.conftest import read_metrics

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
# The two clusters' tests are mostly waits (Ray's node starts, the job's polling: ~25 CPU-s in
# ~100 s): their clusters run in the background lane (tests/lane.py) beside the main tests, each a
# job function below that prints what its test asserts.
LANE_TESTS = {
    "test_submit_to_two_node_cluster": "two_node_submission",
    "test_submit_refuses_a_head_without_auth": "head_without_auth",
}
RUNS = Path(tempfile.gettempdir()) / f"tracerl-submit-{os.getpid()}"


def lane_jobs() -> dict[str, lane.Job]:
    code = "from tests.scripts.test_submit import {0}; {0}({1!r})"
    return {job: lane.Job(["-c", code.format(job, str(RUNS / job))], 900, own_ray=True) for job in LANE_TESTS.values()}


def outcome(proc: subprocess.CompletedProcess) -> dict:
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def own_ports() -> list[str]:
    """Fresh ports for every server a node starts: the defaults may be taken by another
    Ray on this machine (the test session's own, for one), which silently breaks the
    job agent ("No available agent to submit job")."""
    names = [
        "object-manager-port",
        "node-manager-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    ]
    return [f"--{n}={free_port()}" for n in names]


def start(args, env, log, command=(RAY, "start")):
    # own process group: stopping it stops exactly this node's Ray processes
    return subprocess.Popen(
        [*command, "--block", *own_ports(), *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(nodes) -> None:
    for p in reversed(nodes):
        os.killpg(p.pid, signal.SIGTERM)
    for p in nodes:
        p.wait(timeout=60)


def submitted(url: str, token: str | None = None) -> list[str]:
    """The submission ids of the jobs the head ran, from its Jobs API (what `ray job list` lists,
    without a CLI process: ~2 CPU-s)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/api/jobs/", headers=headers), timeout=30) as r:
        return [job["submission_id"] for job in json.load(r) if job.get("submission_id")]


def get(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:  # an answer: the server is up
        return e.code


# ---- token auth on a fresh head ------------------------------------------------------------


def fresh_machine(home: Path, **extra: str) -> dict:
    """The environment of a machine that never ran Ray: an empty HOME (no ~/.ray/auth_token),
    no Ray auth settings and no cluster to join (the lane's, for one)."""
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RAY_AUTH") and k not in ("RAY_ADDRESS", "TRACERL_RAY_ADDRESS")
    }
    # SIGTERM stops the node at once instead of draining it for 30 s (nothing to drain here)
    return {**env, "HOME": str(home), "PYTHON": sys.executable, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", **extra}


def start_head(command, env, tmp_path: Path):
    """A one-node head (own temp dir and ports) with `command` (`ray start` or our script);
    returns the process, its dashboard URL and the short temp dir to remove."""
    short = Path(tempfile.mkdtemp(prefix="tr-", dir="/tmp"))  # Ray's socket paths stay < 107 bytes
    dash = free_port()
    log = open(tmp_path / "head.log", "w")
    head = start(
        [
            "--head",
            f"--port={free_port()}",
            "--num-cpus=1",
            f"--dashboard-port={dash}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--temp-dir={short}",
            f"--ray-client-server-port={free_port()}",
        ],
        env,
        log,
        command,
    )
    log.close()  # the child keeps its own copy
    return head, f"http://127.0.0.1:{dash}", short


def auth_mode(url: str, timeout_s: float = 120.0) -> str:
    """The head's own answer (a public endpoint), once its dashboard is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/authentication_mode", timeout=2) as r:
                return json.load(r)["authentication_mode"]
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)  # an external process coming up: nothing to block on


# what a job submission prints when the head's job agent is not up yet or dropped the connection
TRANSIENT = re.compile(r"No available agent to submit job|RemoteDisconnected|Connection aborted|Connection refused")


def ray_job(args: list[str], url: str, env: dict) -> subprocess.CompletedProcess:
    """`ray job ...` against the head, retried while its job agent is still starting (or dropped the
    connection: a starved box, 2026-12-06)."""
    for _ in range(24):
        proc = subprocess.run(
            [RAY, "job", *args[:1], "--address", url, *args[1:]], env=env, capture_output=True, text=True, timeout=300
        )
        if not TRANSIENT.search(proc.stdout + proc.stderr):
            return proc
        time.sleep(5)
    return proc


PRINT_ONE = ["submit", "--", sys.executable, "-c", "print('job', 'ran')"]  # prints 'job ran'


@pytest.mark.e2e
def test_submit_to_two_node_cluster():
    """The README's cluster, from fresh machines: the head made with scripts/ray_start.sh makes its
    token and refuses jobs without it; a job submitted with it trains two policies over two nodes."""
    seen = lane.result("two_node_submission")  # its job fails if the head's auth mode is not token
    assert seen["token_readable_by_others"] == 0, "the generated token is readable by others"
    assert seen["version_with_token"] == 200 and seen["version_without"] == 401, "the dashboard wants it"
    refused, wrong, script, accepted = (seen[k] for k in ("refused", "wrong", "script", "accepted"))
    assert refused["returncode"] != 0 and "job ran" not in refused["stdout"], refused
    assert "Authentication required" in refused["stdout"] + refused["stderr"], refused["stderr"][-2000:]
    assert wrong["returncode"] != 0 and "Authentication failed" in wrong["stdout"] + wrong["stderr"], wrong
    # submit.sh says what is missing before it uploads anything
    assert script["returncode"] != 0 and "requires a token" in script["stderr"], script["stderr"][-2000:]
    assert accepted["returncode"] == 0 and "job ran" in accepted["stdout"], accepted

    proc = seen["submit"]
    assert proc["returncode"] == 0, (proc["stdout"] + proc["stderr"])[-4000:]
    assert "succeeded" in proc["stdout"] + proc["stderr"]
    # with the token: the one-line job and the training job (submit.sh found the token where the
    # CLI does and sent it, RAY_AUTH_MODE unset in `client`); none without it
    assert len(seen["jobs"]) == 2, f"only the jobs with the token ran: {seen['jobs']}"
    run_dir = Path(seen["run_dir"])
    summary = json.loads((run_dir / "summary.json").read_text())
    main, critic = summary["policies"]["main"], summary["policies"]["critic"]
    [head] = main["engine_nodes"]
    assert len(main["learner_nodes"]) == 2 and set(main["learner_nodes"]) != {head}, "main's ranks on node 2"
    [node2] = set(main["learner_nodes"])
    assert critic["engine_nodes"] == [node2] and critic["learner_nodes"] == [node2], "critic on node 2"
    assert main["trained_tokens"] > 0 and critic["trained_tokens"] > 0 and critic["version"] == 2
    # weights crossed nodes over each policy's collective group (learners on node 2, main's engine on the head)
    assert main["sync"] == critic["sync"] == "CollectiveSync"
    pushes = [
        m[f"sync/{p}/fallbacks"] for m in read_metrics(run_dir) for p in ("main", "critic") if f"sync/{p}/seconds" in m
    ]
    assert len(pushes) == 4 and not any(pushes), pushes
    shutil.rmtree(RUNS / "two_node_submission", ignore_errors=True)


def two_node_submission(out: str) -> None:
    """The lane's job for the test above (two Ray nodes and a job training two policies over them:
    ~5 GiB): the head started with scripts/ray_start.sh on a fresh machine, the jobs without and
    with its token, then the training job submitted with scripts/submit.sh; what each did as a
    JSON line, the run's files left in `out`/run."""
    tmp = Path(out)
    tmp.mkdir(parents=True)
    cache = os.environ.get("TRACERL_CACHE", str(Path.home() / ".cache" / "tracerl"))  # the built models
    # and vLLM's model-info cache: in a cold one each engine's first start inspects the model in a
    # subprocess of its own (~8 CPU-s), a machine's first run only
    vllm_cache = os.environ.get("VLLM_CACHE_ROOT", str(Path.home() / ".cache" / "vllm"))
    env = fresh_machine(tmp / "cluster", TRACERL_CACHE=cache, VLLM_CACHE_ROOT=vllm_cache)  # both nodes' HOME
    ray_start = ("bash", str(ROOT / "scripts/ray_start.sh"))  # the nodes start as the README says
    # short temp dirs: Ray's unix socket paths must stay under 107 bytes
    short = Path(tempfile.mkdtemp(prefix="tr-", dir="/tmp"))
    gcs, dash = free_port(), free_port()
    url = f"http://127.0.0.1:{dash}"
    logs = open(tmp / "ray.log", "w")
    nodes = [
        start(
            [
                f"--port={gcs}",
                "--head",
                "--num-cpus=2",
                f"--dashboard-port={dash}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--temp-dir={short / 'head'}",
                f"--ray-client-server-port={free_port()}",
                '--resources={"rollout_node": 1}',
            ],
            env,
            logs,
            ray_start,
        )
    ]
    try:
        seen = without_and_with_the_token(url, tmp)
        nodes.append(
            start(
                [
                    f"--address=127.0.0.1:{gcs}",
                    "--num-cpus=2",
                    f"--temp-dir={short / 'node2'}",
                    '--resources={"learner_node": 1, "critic_node": 1}',
                ],
                env,
                logs,
                ray_start,
            )
        )
        run_dir = tmp / "run"
        client = fresh_machine(tmp / "client", TRACERL_CACHE=cache, RAY_AUTH_TOKEN=seen["token"])
        for _ in range(24):  # the head's job agent starts a little after its dashboard
            proc = subprocess.run(
                [
                    "bash",
                    "scripts/submit.sh",
                    "experiment=smoke",
                    "cluster=two_node_cpu",
                    "trainer.steps=2",
                    "eval.size=4",
                    f"run_dir={run_dir}",
                    "harness=solver_verifier",
                    "agents.verifier=critic",
                    "+policies.critic.engine.resources={critic_node:0.5}",
                    "+policies.critic.learner.world_size=1",
                    "+policies.critic.learner.resources={critic_node:0.25}",
                ],
                cwd=ROOT,
                env={**client, "RAY_ADDRESS": url},
                capture_output=True,
                text=True,
                timeout=600,
            )
            if "No available agent to submit job" not in proc.stderr:
                break
            time.sleep(5)
        seen |= {"submit": outcome(proc), "jobs": submitted(url, seen["token"]), "run_dir": str(run_dir)}
    finally:
        stop(nodes)
        logs.close()
        shutil.rmtree(short, ignore_errors=True)
    print(json.dumps(seen))


def without_and_with_the_token(url: str, tmp: Path) -> dict:
    """A head started with scripts/ray_start.sh on a fresh machine (HOME tmp/cluster) made a token:
    its mode bits for others, the dashboard's answer with and without it, and one-line jobs without
    it, with a wrong one (the CLI; submit.sh) and with it."""
    if (mode := auth_mode(url)) != "token":  # the job fails, its test with this line
        log = (tmp / "ray.log").read_text()[-2000:]
        raise RuntimeError(f"the head has auth mode {mode!r}, not 'token'; its log:\n{log}")
    token_file = tmp / "cluster" / ".ray" / "auth_token"
    token = token_file.read_text().strip()
    client = fresh_machine(tmp / "no_token")  # another machine: no token
    script = subprocess.run(
        ["bash", "scripts/submit.sh", "trainer.steps=1"],
        cwd=ROOT,
        env={**client, "RAY_ADDRESS": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {
        "token": token,
        "token_readable_by_others": token_file.stat().st_mode & 0o077,
        "version_with_token": get(f"{url}/api/version", token),
        "version_without": get(f"{url}/api/version"),
        "refused": outcome(ray_job(PRINT_ONE, url, client)),
        "wrong": outcome(ray_job(PRINT_ONE, url, {**client, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32})),
        "script": outcome(script),
        # that submit.sh finds the token where the CLI does and sends it: the training job it submits
        "accepted": outcome(ray_job(PRINT_ONE, url, {**client, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})),
    }


@pytest.mark.e2e
def test_submit_refuses_a_head_without_auth():
    seen = lane.result("head_without_auth")
    assert seen["auth_mode"] == "disabled", "Ray now turns auth on for `ray start` too: revisit ray_start.sh"
    script = seen["script"]
    assert script["returncode"] != 0, script
    assert "WITHOUT token authentication" in script["stderr"] and "ray_start.sh" in script["stderr"], script
    assert seen["jobs"] == [], "submit.sh submitted a job to a head without auth"


def head_without_auth(out: str) -> None:
    """The lane's job for the test above: what the README used to say, plain `ray start --head` on
    a machine without a token, then scripts/submit.sh against it; a JSON line of what it did."""
    tmp = Path(out)
    tmp.mkdir(parents=True)
    env = fresh_machine(tmp / "home")
    head, url, short = start_head([RAY, "start"], env, tmp)
    try:
        mode = auth_mode(url)
        script = subprocess.run(
            ["bash", "scripts/submit.sh", "trainer.steps=1"],
            cwd=ROOT,
            env={**env, "RAY_ADDRESS": url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        seen = {"auth_mode": mode, "script": outcome(script), "jobs": submitted(url)}
    finally:
        stop([head])
        shutil.rmtree(short, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(seen))


@pytest.mark.unit
def test_ray_start_needs_the_token_on_other_nodes(tmp_path):
    """A node joining a cluster stops with a message, before `ray start`, when it has no token."""
    env = fresh_machine(tmp_path / "home")
    script = ["bash", str(ROOT / "scripts/ray_start.sh"), "--address", "127.0.0.1:1"]
    joined = subprocess.run(script, env=env, capture_output=True, text=True, timeout=120)
    assert joined.returncode != 0 and "copy the head's ~/.ray/auth_token" in joined.stderr, joined.stderr
    missing = {**env, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "absent")}
    for args in (["--head"], ["--address", "127.0.0.1:1"]):
        proc = subprocess.run([*script[:2], *args], env=missing, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "RAY_AUTH_TOKEN_PATH" in proc.stderr, proc.stderr
    assert not (tmp_path / "home" / ".ray").exists(), "no token made where Ray would not look"
