"""A two-node Ray cluster on this machine, the job submitted with scripts/submit.sh.

The head and a second node each get their own temp dir, ports and custom
resources. Two trained policies: the cluster preset puts `main`'s engine on the
head and its learner ranks on the second node; `critic` asks for a resource only
the second node has, so its engine and learner rank go there. The test stops
only the processes it started.
"""

import json
import os
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

from tests.conftest import read_metrics

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def own_ports() -> list[str]:
    """Fresh ports for every server a node starts: the defaults may be taken by another
    Ray on this machine (the test session's own, for one), which silently breaks the
    job agent ("No available agent to submit job")."""
    names = ["object-manager-port", "node-manager-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port"]
    return [f"--{n}={free_port()}" for n in names]


def start(args, env, log):
    # own process group: stopping it stops exactly this node's Ray processes
    return subprocess.Popen([RAY, "start", "--block", *own_ports(), *args], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def auth_token(env: dict) -> str:
    """The token every node and the CLI use: made once per machine in ~/.ray/auth_token."""
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
    return (Path.home() / ".ray" / "auth_token").read_text().strip()


def get(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:  # an answer: the server is up
        return e.code


def wait_for_dashboard(url: str, token: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status = get(url, token)
            assert status == 200, f"dashboard {url} answered {status} to an authenticated request"
            return
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)  # an external process coming up: nothing to block on


@pytest.mark.slow
def test_submit_to_two_node_cluster(tmp_path):
    # Ray's token auth on, explicitly: `ray start` alone turns it on only where a token exists
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    token = auth_token(env)
    # short temp dirs: Ray's unix socket paths must stay under 107 bytes
    short = Path(tempfile.mkdtemp(prefix="tr-", dir="/tmp"))
    gcs, dash = free_port(), free_port()
    logs = open(tmp_path / "ray.log", "w")
    nodes = [start([f"--port={gcs}", "--head", "--num-cpus=2", f"--dashboard-port={dash}",
                    "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--temp-dir={short / 'head'}",
                    f"--ray-client-server-port={free_port()}",
                    '--resources={"rollout_node": 1}'], env, logs)]
    try:
        wait_for_dashboard(f"http://127.0.0.1:{dash}/api/version", token)
        assert get(f"http://127.0.0.1:{dash}/api/version") == 401, "the dashboard must refuse a request without the token"
        nodes.append(start([f"--address=127.0.0.1:{gcs}", "--num-cpus=2", f"--temp-dir={short / 'node2'}",
                            '--resources={"learner_node": 1, "critic_node": 1}'], env, logs))
        run_dir = tmp_path / "run"
        for _ in range(24):  # the head's job agent starts a little after its dashboard
            proc = subprocess.run(
                ["bash", "scripts/submit.sh", "experiment=smoke", "cluster=two_node_cpu", "trainer.steps=2",
                 "eval.size=4", f"run_dir={run_dir}", "harness=solver_verifier", "agents.verifier=critic",
                 "+policies.critic.engine.resources={critic_node:0.5}", "+policies.critic.learner.world_size=1",
                 "+policies.critic.learner.resources={critic_node:0.25}"],
                cwd=ROOT, env={**env, "RAY_ADDRESS": f"http://127.0.0.1:{dash}"}, capture_output=True,
                text=True, timeout=900)
            if "No available agent to submit job" not in proc.stderr:
                break
            time.sleep(5)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert "succeeded" in proc.stdout + proc.stderr
        summary = json.loads((run_dir / "summary.json").read_text())
        main, critic = summary["policies"]["main"], summary["policies"]["critic"]
        [head] = main["engine_nodes"]
        assert len(main["learner_nodes"]) == 2 and set(main["learner_nodes"]) != {head}, "main's ranks on node 2"
        [node2] = set(main["learner_nodes"])
        assert critic["engine_nodes"] == [node2] and critic["learner_nodes"] == [node2], "critic on node 2"
        assert main["trained_tokens"] > 0 and critic["trained_tokens"] > 0 and critic["version"] == 2
        # weights crossed nodes over each policy's collective group (learners on node 2, main's engine on the head)
        assert main["sync"] == critic["sync"] == "CollectiveSync"
        pushes = [m[f"sync/{p}/fallbacks"] for m in read_metrics(run_dir) for p in ("main", "critic")
                  if f"sync/{p}/seconds" in m]
        assert len(pushes) == 4 and not any(pushes), pushes
    finally:
        for p in reversed(nodes):
            os.killpg(p.pid, signal.SIGTERM)
        for p in nodes:
            p.wait(timeout=60)
        logs.close()
        shutil.rmtree(short, ignore_errors=True)
